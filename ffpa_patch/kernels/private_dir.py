"""Folders whose files are loaded as native code: made owner-only, refused when another user
could have put a file there.

The kernel caches hold compiled kernels (``.o`` files) that the next run loads and executes.
A cache on a shared path (a cluster's /tmp, a shared filesystem set by an admin) would let
another user plant one. As pip and ssh do: create folders 0700; before loading, require each
folder to be ours and writable by no one else, and each folder above it to belong to us or
root and be writable by others only when sticky (like /tmp, where no one can replace our entry).
"""
from __future__ import annotations

import os
import stat


def make(path: str) -> None:
    """Create ``path`` and any missing folder above it, each owner-only (0700)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.exists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # another rank made it first: it is vetted like any other
            pass


def _writers(mode: int) -> str:
    return " and ".join(who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit)


def problem(path: str) -> str | None:
    """Why files under ``path`` could come from another user, or None when only we (or root, above) could write them."""
    uid = os.getuid()
    current = os.path.realpath(path)
    first = True
    while True:
        info = os.stat(current)
        if first:
            if info.st_uid != uid:
                return f"{current} belongs to another user (uid {info.st_uid})"
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"{current} is writable by {_writers(info.st_mode)}"
        else:
            if info.st_uid not in (0, uid):
                return f"{current}, above it, belongs to another user (uid {info.st_uid})"
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
                return f"{current}, above it, is writable by {_writers(info.st_mode)} and not sticky"
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current, first = parent, False


def file_problem(path: str) -> str | None:
    """A file about to be loaded: ours, and writable by no one else."""
    info = os.stat(path)
    if info.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by {_writers(info.st_mode)}"
    return None
