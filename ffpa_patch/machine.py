"""Can the fused kernels run on this machine? Asked without importing torch (``ffpa-patch status``).

The answer comes from the NVIDIA driver's own files (each GPU's model name in
/proc/driver/nvidia/gpus) and from package metadata. It judges by name, so it says "should";
``ffpa-patch status --check`` imports torch and the kernels and asks them.
"""
from __future__ import annotations

import glob
import os
import re

from . import versions

PROC = "/proc/driver/nvidia/gpus"
#: data-center Hopper (sm90) and Blackwell (sm100) parts, the GPUs FFPA's kernels are built for
FUSED_GPUS = re.compile(r"\b(H100|H200|H800|H20|GH200|B100|B200|B300|GB200|GB300)\b")


def nvidia_gpus(proc: str = PROC) -> list[str]:
    """Model names of the NVIDIA GPUs the driver lists ([] when there is no driver or GPU)."""
    names = []
    for info in sorted(glob.glob(os.path.join(proc, "*", "information"))):
        try:
            with open(info) as f:
                names += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model:")]
        except OSError:
            pass
    return names


def fused_kernels_here(proc: str = PROC) -> tuple[bool, str]:
    """(True when the fused kernels should run here, what was found, in words)."""
    gpus = nvidia_gpus(proc)
    if not gpus:
        if glob.glob("/dev/nvidia[0-9]*"):
            return False, "NVIDIA device files found but no GPU model could be read; `ffpa-patch status --check` asks the GPU"
        return False, "no NVIDIA GPU found: every attention call falls back to stock SDPA here"
    fused = [g for g in gpus if FUSED_GPUS.search(g)]
    if not fused:
        return False, f"{gpus[0]}: not a Hopper/Blackwell data-center GPU (FFPA runs on sm90/sm100): attention falls back to SDPA"
    from .kernels import packages
    from .names import Layer

    found = [versions.check(p) for p in packages(Layer.FULL)]
    usable = [c for c in found if c.installed is not None]
    if not usable:
        need = " or ".join(versions.requirement(c.name) for c in found)
        return False, f"{fused[0]}, but {' / '.join(c.name for c in found)} is not installed: pip install {need}"
    return True, f"{fused[0]}, {usable[0].name} {usable[0].installed}: the fused kernels should run here"
