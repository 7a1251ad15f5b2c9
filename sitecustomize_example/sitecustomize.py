"""PYTHONPATH=sitecustomize_example python train.py: ffpa_patch active in every process.

Registers post-import hooks only (torch and transformers are not imported here) and
chains to your own sitecustomize. Never raises.
"""
import sys

try:
    from ffpa_patch.bootstrap import activate_and_chain
except Exception as exc:
    sys.stderr.write(f"ffpa_patch: not importable, not activated ({exc})\n")
else:
    activate_and_chain(__file__)
