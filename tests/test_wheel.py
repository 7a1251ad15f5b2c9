"""The package as a user installs it: a wheel and an sdist built from the clone, the wheel
installed into a fresh venv outside the clone, its commands run there."""
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: setuptools from this environment (an isolated build would download it)
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), ROOT],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheel = next(out.glob("*.whl"))
    sdist = next(out.glob("*.tar.gz"))
    return wheel, sdist


def test_the_wheel_and_sdist_carry_everything(built):
    wheel, sdist = built
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("ffpa_patch/bootstrap/sitecustomize.py", "ffpa_patch/startup.py", "ffpa_patch/cli.py"):
        assert needed in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License: Apache-2.0" in metadata
    from ffpa_patch.versions import SUPPORTED

    low, high = sorted(SUPPORTED["ffpa-attn"].split(","), key=lambda s: s[0] != ">")
    assert f"Requires-Dist: ffpa-attn{high},{low}; extra == \"ffpa\"" in metadata  # one range everywhere
    members = tarfile.open(sdist).getnames()
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "ffpa_patch/bootstrap/sitecustomize.py", "ffpa_patch/startup.py",
                   "ffpa_patch/kernels/catalog.py", "pytest.ini", "tox.ini"):
        assert any(m.endswith("/" + needed) for m in members), needed
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # every test file and what they import
    for test_file in sorted(os.listdir(os.path.join(root, "tests"))):
        if test_file.endswith(".py"):
            assert any(m.endswith("/tests/" + test_file) for m in members), test_file


def test_the_wheel_installed_outside_the_clone_runs_its_commands(built, tmp_path):
    import site

    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # torch and Transformers come from this environment (a plain path entry: its editable
    # install of the clone is not on it), so nothing of several GB is downloaded
    packages = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(packages, "outer_environment.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_") and k != "PYTHONPATH"}
    where = subprocess.run([str(python), "-c", "import ffpa_patch; print(ffpa_patch.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    exe = venv / "bin" / "ffpa-patch"
    status = subprocess.run([str(exe), "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert status.stdout.startswith("ffpa_patch: active"), status.stdout + status.stderr
    assert status.returncode in (0, 3) and f"exit code {status.returncode}" in status.stdout
    folder = subprocess.run([str(exe), "sitecustomize-path"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300).stdout.strip()
    assert folder.startswith(str(venv)) and os.path.isfile(os.path.join(folder, "sitecustomize.py"))
