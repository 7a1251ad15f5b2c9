"""Patch targets, one module each; ``ALL`` lists them in apply order."""
from .attention_backend import FFPABackend
from .deepspeed_ulysses import DeepSpeedUlysses
from .gemma4_dropin import DROPINS
from .nemo_moe_ring import NemoMoERing
from .sdpa_repeat_kv import SdpaRepeatKV

ALL = (SdpaRepeatKV, FFPABackend, *DROPINS, DeepSpeedUlysses, NemoMoERing)


def kernels_cannot_run_here() -> list[str]:
    """For the FFPA patches' status rows: in place is not the same as running FFPA.
    Only asks torch if it is already imported (status() never imports it)."""
    import importlib.util
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and not torch.cuda.is_available():  # installing a kernel package would not help here
        return ["in place, but no CUDA device here: every call falls back to SDPA"]
    found = []
    if importlib.util.find_spec("ffpa_attn") is None:
        from ..versions import requirement

        found.append(f"in place, but ffpa-attn is not installed: full layers fall back to SDPA (pip install {requirement('ffpa-attn')})")
    return found
