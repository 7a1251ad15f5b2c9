"""Activates ffpa_patch in every Python process that has this folder on PYTHONPATH.

Then chains to the user's own sitecustomize (if any): this folder is taken off
sys.path, the other one is imported, and the path is restored. Only hooks are
registered here; torch and transformers are not imported. Never raises.
"""
import importlib
import os
import sys


def _chain_user_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    ours = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


try:
    import ffpa_patch  # noqa: F401  (importing activates it; FFPA_PATCH_DISABLE=1 turns it off)
except Exception as exc:  # a startup hook must never stop the interpreter
    sys.stderr.write(f"ffpa_patch: not activated ({exc})\n")
_chain_user_sitecustomize()
