"""flash-attn-4's own disk cache is switched on for its import, and only for its import.

A stand-in ``flash_attn.cute`` on sys.path reads the two variables at import time, as
flash-attn-4's ``cache_utils`` does; ffpa_patch's wiring (``fa4.import_error``) is the
code under test.
"""
import os
import sys

import pytest

import ffpa_patch
from ffpa_patch.kernels import disk_cache, fa4

STAND_IN = """import os
CUTE_DSL_CACHE_ENABLED = os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0") == "1"
CUTE_DSL_CACHE_DIR = os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", None)
"""


@pytest.fixture
def flash_attn_4(tmp_path, monkeypatch):
    """Imports the stand-in through fa4.import_error(); returns its cache_utils module."""
    package = tmp_path / "site" / "flash_attn" / "cute"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "cache_utils.py").write_text(STAND_IN)
    (package / "__init__.py").write_text("from .cache_utils import *\ndef flash_attn_func(): pass\n")
    dist = tmp_path / "site" / "flash_attn_4-4.0.0b40.dist-info"  # installed, as importlib.metadata sees it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn-4\nVersion: 4.0.0b40\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in (disk_cache.ENABLED, disk_cache.DIRECTORY, "FFPA_PATCH_KERNEL_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def load():
        fa4.import_error.cache_clear()
        assert fa4.import_error() is None
        return sys.modules["flash_attn.cute.cache_utils"]

    yield load
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        del sys.modules[name]
    fa4.import_error.cache_clear()
    disk_cache.state.clear()


def test_on_by_default_in_the_user_cache_and_the_environment_put_back(flash_attn_4, tmp_path):
    seen = flash_attn_4()
    where = str(tmp_path / "xdg" / "ffpa_patch" / "kernels" / "flash_attn_4")
    assert seen.CUTE_DSL_CACHE_ENABLED and seen.CUTE_DSL_CACHE_DIR == where
    assert os.path.isdir(os.path.dirname(where))  # the root; flash-attn-4 makes its own folder
    assert disk_cache.ENABLED not in os.environ and disk_cache.DIRECTORY not in os.environ
    assert disk_cache.state["flash-attn-4"].startswith(f"on, in {where}")
    text = str(ffpa_patch.status())
    assert f"flash-attn-4 compiled kernels: on, in {where}" in text


def test_not_installed_makes_no_folder_and_lists_nothing(tmp_path, monkeypatch):
    """A CPU machine without flash-attn-4: no cache folder appears, status() lists no flash-attn-4 cache."""
    from ffpa_patch import versions

    if versions.installed("flash-attn-4") is not None:
        pytest.skip("flash-attn-4 is installed here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FFPA_PATCH_KERNEL_CACHE", raising=False)
    disk_cache.state.clear()
    fa4.import_error.cache_clear()
    try:
        assert fa4.import_error() is not None  # not importable, and said so
        assert not (tmp_path / "xdg").exists() and "flash-attn-4" not in disk_cache.report()
    finally:
        fa4.import_error.cache_clear()


def test_a_relative_directory_is_made_absolute(flash_attn_4, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "kernels")
    assert flash_attn_4().CUTE_DSL_CACHE_DIR == str(tmp_path / "kernels" / "flash_attn_4")


@pytest.mark.parametrize("value", ["0", "off", " OFF "])
def test_switched_off(flash_attn_4, monkeypatch, value):
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", value)
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED
    assert disk_cache.state["flash-attn-4"] == "off (FFPA_PATCH_KERNEL_CACHE=0)"


def test_the_users_own_setting_wins(flash_attn_4, monkeypatch, tmp_path):
    monkeypatch.setenv(disk_cache.ENABLED, "0")
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(tmp_path / "ignored"))
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED
    assert os.environ[disk_cache.ENABLED] == "0"
    assert "set by the user" in disk_cache.state["flash-attn-4"]
    assert not (tmp_path / "ignored").exists()


def test_an_unusable_directory_leaves_it_off_with_the_reason_and_flash_attn_4_working(flash_attn_4, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(blocker / "cache"))
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED  # and fa4.import_error() was None: still usable
    assert disk_cache.state["flash-attn-4"].startswith(f"off: cannot use {blocker / 'cache'}")
    assert "FFPA_PATCH_KERNEL_CACHE=DIR names a folder of your own" in caplog.text


# -- the cache holds native code: owner-only folders, and never a folder someone else can write --
def test_folders_the_cache_makes_are_owner_only(flash_attn_4, tmp_path):
    flash_attn_4()
    root = tmp_path / "xdg" / "ffpa_patch" / "kernels"
    for folder in (tmp_path / "xdg", tmp_path / "xdg" / "ffpa_patch", root, root / "flash_attn_4"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_a_cache_folder_others_can_write_is_refused_with_one_line(flash_attn_4, tmp_path, monkeypatch, caplog, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)  # e.g. a team folder an admin set up for everyone
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(shared))
    disk_cache._said.clear()
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED
    who = "its group" if mode == 0o770 else "others"
    assert disk_cache.state["flash-attn-4"].startswith(f"off: {shared} is writable by {who}")
    lines = [r.getMessage() for r in caplog.records if "kernel disk cache" in r.getMessage()]
    assert len(lines) == 1 and str(shared) in lines[0] and "FFPA_PATCH_KERNEL_CACHE=DIR" in lines[0]


def test_a_cache_under_a_folder_others_can_replace_is_refused(flash_attn_4, tmp_path, monkeypatch):
    above = tmp_path / "scratch"
    above.mkdir()
    above.chmod(0o777)  # not sticky: anyone could rename our folder away and put theirs in its place
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(above / "mine"))
    disk_cache._said.clear()
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED
    assert f"{above}, above it, is writable by its group and others and not sticky" in disk_cache.state["flash-attn-4"]


def test_a_cache_of_our_own_in_a_sticky_shared_folder_is_used(flash_attn_4, tmp_path, monkeypatch):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others may write, but not replace what is ours
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(sticky / "mine"))
    assert flash_attn_4().CUTE_DSL_CACHE_ENABLED
    assert (sticky / "mine").stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(not hasattr(os, "chown") or os.getuid() != 0, reason="giving a folder away needs root")
def test_a_cache_folder_that_belongs_to_another_user_is_refused(flash_attn_4, tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, -1)
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(theirs))
    disk_cache._said.clear()
    assert not flash_attn_4().CUTE_DSL_CACHE_ENABLED
    assert disk_cache.state["flash-attn-4"].startswith(f"off: {theirs} belongs to another user (uid 4242)")


def test_imported_before_ffpa_patch_could_turn_it_on(flash_attn_4, monkeypatch):
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "0")
    flash_attn_4()  # imported with the cache off, as a user's earlier import would be
    monkeypatch.delenv("FFPA_PATCH_KERNEL_CACHE")
    flash_attn_4()
    assert disk_cache.state["flash-attn-4"].startswith("off (flash_attn.cute was imported before ffpa_patch")


# ffpa-attn: stand-ins for ffpa-attn (a kernel launcher with ffpa-attn's JITCache) and for
# CuTeDSL's export_to_c / load_module; ffpa_patch's DiskKernels is the code under test.
FFPA_CACHE_UTILS = """class JITCache:
    def __init__(self):
        self.cache = {}
    def __setitem__(self, key, fn):
        self.cache[key] = fn
    def __getitem__(self, key):
        return self.cache[key]
    def __contains__(self, key):
        return key in self.cache
    def clear(self):
        self.cache.clear()
"""
FFPA_LAUNCHER = """from .utils.cache_utils import JITCache

COMPILES = []

class Compiled:
    def __init__(self, scale):
        self.scale = scale
    def __call__(self, x):
        return x * self.scale
    def export_to_c(self, object_file_path, function_name):
        with open(object_file_path, "w") as f:
            f.write(f"{function_name}={self.scale}")

def launch(scale, x):
    key = ("fwd", scale)
    if key not in launch.compile_cache:
        COMPILES.append(key)
        launch.compile_cache[key] = Compiled(scale)
    return launch.compile_cache[key](x)

launch.compile_cache = JITCache()
"""
CUTE_RUNTIME = """import types
def load_module(path, enable_tvm_ffi=False):
    assert enable_tvm_ffi
    name, scale = open(path).read().split("=")
    from ffpa_attn.cute._fwd import Compiled
    return types.SimpleNamespace(**{name: Compiled(float(scale))})
"""


@pytest.fixture
def ffpa_attn(tmp_path, monkeypatch):
    site = tmp_path / "site"
    files = {
        "ffpa_attn/__init__.py": "", "ffpa_attn/cute/__init__.py": "from . import _fwd\n",
        "ffpa_attn/cute/utils/__init__.py": "", "ffpa_attn/cute/utils/cache_utils.py": FFPA_CACHE_UTILS,
        "ffpa_attn/cute/_fwd.py": FFPA_LAUNCHER, "ffpa_attn-0.2.4.dist-info/METADATA": "Name: ffpa-attn\nVersion: 0.2.4\n",
        "cutlass/__init__.py": "", "cutlass/cute/__init__.py": "from . import runtime\n", "cutlass/cute/runtime.py": CUTE_RUNTIME,
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", str(tmp_path / "kernels"))
    from ffpa_patch.kernels import ffpa as ffpa_kernels

    def load():
        ffpa_kernels.import_error.cache_clear()
        assert ffpa_kernels.import_error() is None
        return sys.modules["ffpa_attn.cute._fwd"]

    def next_process():
        """What a new process sees: nothing in memory, the disk as it was."""
        from ffpa_patch.kernels import ffpa_disk

        ffpa_disk.restore()
        sys.modules["ffpa_attn.cute._fwd"].launch.compile_cache.clear()
        return load()

    load.next_process = next_process
    yield load
    from ffpa_patch.kernels import ffpa_disk

    ffpa_disk.restore()
    for name in [m for m in sys.modules if m.split(".")[0] in ("ffpa_attn", "cutlass")]:
        del sys.modules[name]
    ffpa_kernels.import_error.cache_clear()
    disk_cache.state.clear()


def test_ffpa_kernels_are_written_once_and_loaded_by_the_next_process(ffpa_attn, tmp_path):
    fwd = ffpa_attn()
    assert fwd.launch(2.0, 3.0) == 6.0 and fwd.launch(2.0, 1.0) == 2.0
    assert len(fwd.COMPILES) == 1
    written = list((tmp_path / "kernels" / "ffpa_attn").rglob("*.o"))
    assert len(written) == 1 and "_fwd.launch.compile_cache" in str(written[0])
    assert disk_cache.state["ffpa-attn"].startswith(f"on, in {tmp_path / 'kernels' / 'ffpa_attn'}")
    assert "0 loaded from disk, 1 compiled and written" in str(ffpa_patch.status())

    fwd = ffpa_attn.next_process()
    assert fwd.launch(2.0, 5.0) == 10.0
    assert len(fwd.COMPILES) == 1  # no new compile: the kernel came from disk
    assert "1 loaded from disk, 0 compiled and written" in str(ffpa_patch.status())
    assert fwd.launch(3.0, 1.0) == 3.0 and len(fwd.COMPILES) == 2  # another key still compiles


def test_a_broken_file_is_a_miss_compiled_again_and_replaced(ffpa_attn, tmp_path):
    ffpa_attn().launch(2.0, 1.0)
    (written,) = (tmp_path / "kernels" / "ffpa_attn").rglob("*.o")
    written.write_text("garbage")
    fwd = ffpa_attn.next_process()
    assert fwd.launch(2.0, 4.0) == 8.0 and len(fwd.COMPILES) == 2
    assert written.read_text() == "func=2.0"


@pytest.mark.parametrize("planted", ["group-writable file", "group-writable folder"])
def test_a_kernel_file_someone_else_could_have_written_is_never_loaded(ffpa_attn, tmp_path, planted):
    ffpa_attn().launch(2.0, 1.0)
    (written,) = (tmp_path / "kernels" / "ffpa_attn").rglob("*.o")
    written.write_text("func=1000.0")  # what a planted kernel computes: not scale 2
    (written if planted.endswith("file") else written.parent).chmod(0o660 if planted.endswith("file") else 0o770)
    fwd = ffpa_attn.next_process()
    assert fwd.launch(2.0, 4.0) == 8.0 and len(fwd.COMPILES) == 2  # compiled afresh, the file refused


def test_revert_puts_ffpa_attns_own_cache_back_with_its_kernels(ffpa_attn):
    fwd = ffpa_attn()
    own = fwd.launch.compile_cache.memory
    fwd.launch(2.0, 1.0)
    ffpa_patch.revert()
    try:
        assert fwd.launch.compile_cache is own and ("fwd", 2.0) in own
        assert "reverted" in disk_cache.state["ffpa-attn"]
    finally:
        ffpa_patch.apply()
    assert fwd.launch.compile_cache.memory is own  # apply() keeps them on disk again
    ffpa_patch.apply()
    assert fwd.launch.compile_cache.memory is own  # never wrapped twice


def test_off_leaves_ffpa_attn_alone(ffpa_attn, monkeypatch):
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "0")
    fwd = ffpa_attn()
    assert type(fwd.launch.compile_cache).__name__ == "JITCache"
    assert disk_cache.state["ffpa-attn"] == "off (FFPA_PATCH_KERNEL_CACHE=0)"


def test_an_unverified_ffpa_attn_version_keeps_its_in_memory_cache(ffpa_attn, tmp_path):
    (tmp_path / "site" / "ffpa_attn-0.2.4.dist-info" / "METADATA").write_text("Name: ffpa-attn\nVersion: 0.3.0\n")
    fwd = ffpa_attn()
    assert type(fwd.launch.compile_cache).__name__ == "JITCache"
    assert "verified with ffpa-attn 0.2.4, found 0.3.0" in disk_cache.state["ffpa-attn"]


@pytest.mark.parametrize("cache", ["on", "0"])
def test_status_counts_the_kernels_held_and_new_keys_only_add_one(ffpa_attn, monkeypatch, cache):
    """status().compiles counts ffpa-attn's compiled kernels, whether its JITCache is ours
    (disk) or its own (cache off): a repeated key adds none, a new key one."""
    if cache == "0":
        monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "0")
    fwd = ffpa_attn()
    assert "ffpa-attn" not in ffpa_patch.status().compiles
    for x in range(5):
        fwd.launch(2.0, float(x))
    assert ffpa_patch.status().compiles["ffpa-attn"] == 1
    fwd.launch(3.0, 1.0)
    status = ffpa_patch.status()
    assert status.compiles["ffpa-attn"] == 2 and status.as_dict()["compiles"]["ffpa-attn"] == 2
    assert "ffpa-attn kernels built or loaded: 2" in str(status)
