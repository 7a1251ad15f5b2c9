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
    where = str(tmp_path / "xdg" / "ffpa_patch" / "flash_attn_4")
    assert seen.CUTE_DSL_CACHE_ENABLED and seen.CUTE_DSL_CACHE_DIR == where
    assert os.path.isdir(where)
    assert disk_cache.ENABLED not in os.environ and disk_cache.DIRECTORY not in os.environ
    assert disk_cache.state["flash-attn-4"].startswith(f"on, in {where}")
    assert "no disk cache" in disk_cache.state["ffpa-attn"]
    text = str(ffpa_patch.status())
    assert f"flash-attn-4 compiled kernels: on, in {where}" in text
    assert "ffpa-attn compiled kernels: in-process only" in text


def test_a_relative_directory_is_made_absolute(flash_attn_4, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "kernels")
    assert flash_attn_4().CUTE_DSL_CACHE_DIR == str(tmp_path / "kernels")


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
    assert "writable directory" in caplog.text


def test_imported_before_ffpa_patch_could_turn_it_on(flash_attn_4, monkeypatch):
    monkeypatch.setenv("FFPA_PATCH_KERNEL_CACHE", "0")
    flash_attn_4()  # imported with the cache off, as a user's earlier import would be
    monkeypatch.delenv("FFPA_PATCH_KERNEL_CACHE")
    flash_attn_4()
    assert disk_cache.state["flash-attn-4"].startswith("off (flash_attn.cute was imported before ffpa_patch")
