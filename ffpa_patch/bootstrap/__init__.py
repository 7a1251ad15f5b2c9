"""Start-up activation shared by the shipped sitecustomize and sitecustomize_example/."""
import importlib
import os
import sys


def activate_and_chain(sitecustomize_file: str) -> None:
    """Import ffpa_patch (which only registers hooks), then the user's own sitecustomize.

    The calling sitecustomize's folder is taken off sys.path while the other one is
    imported, then the path is restored. Never raises.
    """
    try:
        import ffpa_patch  # noqa: F401  (importing activates it; FFPA_PATCH_DISABLE=1 turns it off)
    except Exception as exc:  # a startup hook must never stop the interpreter
        sys.stderr.write(f"ffpa_patch: not activated ({exc})\n")
    here = os.path.dirname(os.path.abspath(sitecustomize_file))
    saved = list(sys.path)
    ours = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception as exc:
        sys.stderr.write(f"ffpa_patch: your sitecustomize raised {type(exc).__name__}: {exc}\n")
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours
