"""A disk cache for ffpa-attn's compiled kernels, which ffpa-attn 0.2.4 keeps in memory only.

ffpa-attn compiles each kernel with ``--enable-tvm-ffi`` and keeps it in a ``JITCache``
(a dict keyed by its compile key) hung on the function that launches it. Each one is
replaced here by ``DiskKernels``: the same dict first, then
``<dir>/<sha256 of the pickled key>.o`` written with CuTeDSL's ``export_to_c`` and read
back with ``cute.runtime.load_module(..., enable_tvm_ffi=True)``, as flash-attn-4's own
disk cache does. ``<dir>`` is namespaced by a fingerprint of ffpa-attn's source and the
versions of the CuTeDSL stack, so an upgrade never loads an old kernel. Whatever cannot be
pickled, exported or loaded stays an in-memory compile, never an error. The exported
kernels were checked bit for bit against freshly compiled ones on the H200
(tests/gpu: test_ffpa_kernels_from_disk_match_a_fresh_compile_bit_for_bit), for the
ffpa-attn versions in ``VERIFIED``; other versions keep ffpa-attn's in-memory cache.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys

from . import private_dir

log = logging.getLogger("ffpa_patch")

VERIFIED = ("0.2.4",)
STACK = ("ffpa-attn", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi")
SYMBOL = "func"


_directory: list[str] = []  # where install() put the kernels


def _version(dist: str) -> str:
    from ..versions import installed

    found = installed(dist)
    return "absent" if found is None else str(found)


def fingerprint(package_dir: str) -> str:
    """Changes with any source file of ffpa-attn or any version of its CuTeDSL stack."""
    digest = hashlib.sha256()
    for dist in STACK:
        digest.update(f"{dist}={_version(dist)};".encode())
    for root, dirs, files in os.walk(package_dir):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, package_dir).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:24]


class DiskKernels:
    """Stands in for one ffpa-attn ``JITCache``: its dict first, then the disk."""

    def __init__(self, memory, directory: str):
        self.memory = memory  # ffpa-attn's own JITCache, kept to be put back
        self.directory = directory
        self.loaded = 0
        self.exported = 0

    def _path(self, key) -> str | None:
        try:
            return os.path.join(self.directory, hashlib.sha256(pickle.dumps(key)).hexdigest() + ".o")
        except Exception:  # an unpicklable key is cached in memory only
            return None

    def __contains__(self, key) -> bool:
        if key in self.memory:
            return True
        path = self._path(key)
        if path is None or not os.path.exists(path):
            return False
        refused = private_dir.problem(self.directory) or private_dir.file_problem(path)
        if refused is not None:  # never load native code another user could have written
            log.warning("ffpa_patch: ffpa-attn kernel %s not loaded: %s; compiling instead", path, refused)
            return False
        try:
            import cutlass.cute as cute

            fn = getattr(cute.runtime.load_module(path, enable_tvm_ffi=True), SYMBOL)
        except Exception as exc:  # a truncated or foreign file is a miss: compile, and overwrite it
            log.info("ffpa_patch: ffpa-attn kernel %s not loadable (%s: %s); compiling", path, type(exc).__name__, exc)
            return False
        self.memory[key] = fn
        self.loaded += 1
        return True

    def __getitem__(self, key):
        self.__contains__(key)
        return self.memory[key]

    def __setitem__(self, key, fn) -> None:
        self.memory[key] = fn
        path = self._path(key)
        if path is None:
            return
        partial = f"{path}.{os.getpid()}.tmp.o"
        try:
            private_dir.make(self.directory)
            fn.export_to_c(object_file_path=partial, function_name=SYMBOL)
            if os.path.getsize(partial) == 0:
                raise OSError("empty object file")
            os.replace(partial, path)  # atomic: another rank never reads half a file
            self.exported += 1
        except Exception as exc:
            log.info("ffpa_patch: ffpa-attn kernel not written to %s (%s: %s)", path, type(exc).__name__, exc)
            try:
                os.remove(partial)
            except OSError:
                pass

    def clear(self) -> None:
        self.memory.clear()


_swapped: list[tuple[object, str, DiskKernels]] = []


def _caches():
    """(launcher function, attribute, JITCache) for every ffpa-attn kernel cache imported."""
    from ffpa_attn.cute.utils.cache_utils import JITCache

    for name, module in list(sys.modules.items()):
        if not name.startswith("ffpa_attn.cute.") or module is None:
            continue
        for fn in list(vars(module).values()):
            if callable(fn) and getattr(fn, "__module__", None) == name:
                for attr, cache in list(getattr(fn, "__dict__", {}).items()):
                    if isinstance(cache, JITCache):
                        yield fn, attr, cache


def install(root: str) -> str:
    """Swap in DiskKernels under ``root``; returns what was done, in words. Idempotent."""
    if _swapped:
        return f"on, in {_directory[0]}"
    found = _version("ffpa-attn")
    if found not in VERIFIED:
        return f"in-process only (the disk cache is verified with ffpa-attn {', '.join(VERIFIED)}, found {found})"
    import ffpa_attn

    directory = os.path.join(root, fingerprint(os.path.dirname(ffpa_attn.__file__)))
    for fn, attr, cache in _caches():
        disk = DiskKernels(cache, os.path.join(directory, f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}.{attr}"))
        setattr(fn, attr, disk)
        _swapped.append((fn, attr, disk))
    if not _swapped:
        return "in-process only (no ffpa-attn kernel caches found to keep on disk)"
    _directory[:] = [directory]
    return f"on, in {directory}"


def installed() -> bool:
    return bool(_swapped)


def restore() -> None:
    """Put ffpa-attn's own caches back, with every kernel compiled or loaded meanwhile."""
    while _swapped:
        fn, attr, disk = _swapped.pop()
        setattr(fn, attr, disk.memory)


def counts() -> dict:
    return {"loaded": sum(d.loaded for *_, d in _swapped), "exported": sum(d.exported for *_, d in _swapped)}
