import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("USE_HUB_KERNELS", "0")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)


@pytest.fixture
def patched():
    """ffpa_patch applied (all targets) for the test, reverted afterwards, counts reset."""
    import ffpa_patch

    ffpa_patch.revert()
    ffpa_patch.reset_stats()
    status = ffpa_patch.apply()
    yield status
    ffpa_patch.revert()
    ffpa_patch.reset_stats()


@pytest.fixture
def reference_kernels():
    """The documented seam, taking fp32 too: whole-model tests of fp32 models against fp32 eager."""
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    with use(reference.kernel_set(fp32=True)) as k:
        yield k


@pytest.fixture
def strict_kernels():
    """The documented seam refusing exactly what the GPU kernels refuse (fp32, mixed dtypes,
    head_dim, layout): for tests of which precision routes where."""
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    with use(reference.kernel_set()) as k:
        yield k


def run_python(code: str, env_extra: dict | None = None, args=("-c",)) -> str:
    """Run code in a fresh interpreter; returns stdout, raises with stderr on failure."""
    import subprocess

    env = dict(os.environ)
    env.pop("FFPA_PATCH_DISABLE", None)
    env.update(env_extra or {})
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, *args, code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout
