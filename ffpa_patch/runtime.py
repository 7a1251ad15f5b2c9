"""Settings the attention path reads on every call (set by ``apply``), and its error."""
strict: bool = False


class FFPAFallbackError(RuntimeError):
    """Strict mode: a head_dim > 256 full layer did not run FFPA."""
