"""Supported version ranges (the one place they live) and installed versions.

Installed versions are read with importlib.metadata so checking never imports
torch or transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .kernels.catalog import ranges as kernel_ranges

#: distribution name -> supported range, for the packages that are not kernel packages. Gemma4
#: exists from Transformers 5.5.0; the upper bound is the newest line in the tox matrix.
CORE: dict[str, str] = {
    "transformers": ">=5.5.0,<5.26",
    "torch": ">=2.5",
    "nemo-automodel": ">=0.6,<0.8",
    "deepspeed": ">=0.19,<0.20",  # Ulysses SP: the registration and exchange as tested (0.19.8)
}
#: every range: the core's, and each kernel package's from its row in kernels/catalog.py
SUPPORTED: dict[str, str] = {**CORE, **kernel_ranges()}
#: packages without which the patch does nothing; the others are optional.
REQUIRED = ("transformers", "torch")


def installed(dist: str) -> Version | None:
    """The installed version of ``dist``, or None when it is absent or unreadable."""
    try:
        return Version(metadata.version(dist))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


@dataclass(frozen=True)
class VersionCheck:
    name: str
    installed: str | None
    supported: str
    ok: bool
    required: bool

    @property
    def state(self) -> str:
        if self.installed is None:
            return "not installed"
        return "supported" if self.ok else "UNSUPPORTED"

    @property
    def message(self) -> str:
        if self.installed is None:
            kind = "required" if self.required else "optional"
            return f"{self.name} is not installed ({kind}; works with {self.supported})"
        return f"{self.name} {self.installed} is {self.state} (works with {self.supported})"


def check(dist: str) -> VersionCheck:
    ver = installed(dist)
    spec = SpecifierSet(SUPPORTED[dist], prereleases=True)
    return VersionCheck(
        name=dist,
        installed=None if ver is None else str(ver),
        supported=SUPPORTED[dist],
        ok=ver is not None and ver in spec,
        required=dist in REQUIRED,
    )


def requirement(dist: str) -> str:
    """What to pip install for ``dist``, quoted for a shell: ``'ffpa-attn>=0.2.4,<0.3'``."""
    return f"'{dist}{SUPPORTED[dist]}'"


def check_all() -> list[VersionCheck]:
    return [check(d) for d in SUPPORTED]


def gate_problems(checks: list[VersionCheck]) -> list[str]:
    """Messages for required packages that are missing or outside their range,
    and for optional ones that are present but outside theirs."""
    return [
        c.message
        for c in checks
        if (c.required and not c.ok) or (not c.required and c.installed and not c.ok)
    ]
