"""Lines a user must see: to the ``ffpa_patch`` logger when logging is configured, else stderr
(the library otherwise has only a NullHandler, so its warnings would vanish)."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("ffpa_patch")


def configured() -> bool:
    return bool(logging.getLogger().handlers) or any(not isinstance(h, logging.NullHandler) for h in log.handlers)


def emit(msg: str, level: int = logging.INFO) -> None:
    if configured():
        log.log(level, msg)
    else:
        print(msg, file=sys.stderr)
