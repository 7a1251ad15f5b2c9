"""Settings the attention path reads on every call (set by ``apply``)."""
strict: bool = False
