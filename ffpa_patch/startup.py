"""PYTHONSTARTUP file: ``export PYTHONSTARTUP=$(python -m ffpa_patch startup-path)``.

Python reads PYTHONSTARTUP only in interactive sessions; scripts need the
sitecustomize route or ``ffpa-patch run``.
"""
try:
    import ffpa_patch as _ffpa_patch

    print(f"ffpa_patch: {_ffpa_patch.status().message}")
except Exception as _exc:
    print(f"ffpa_patch: not activated ({_exc})")
