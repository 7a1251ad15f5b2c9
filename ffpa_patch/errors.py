"""The exceptions and the warning ffpa_patch raises to its users, in one place."""
from __future__ import annotations


class UnsupportedVersionError(RuntimeError):
    """Installed versions are outside the supported range (strict mode)."""


class FFPAPatchWarning(UserWarning):
    """Something about ffpa_patch a user should see: a patch off, a version out of range."""


class FFPANotAppliedError(ValueError):
    """attn_implementation="ffpa" was asked for while ffpa_patch is imported but off."""


class FFPAFallbackError(RuntimeError):
    """A Gemma 4 attention call that cannot run as asked: strict mode saw a head_dim > 256 full
    layer miss its fused kernel, or the call cannot be computed exactly at all (no mask on
    "ffpa", torch context parallelism on "ffpa")."""
