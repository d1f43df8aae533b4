"""GGML_ALLOCATOR_DEBUG: narrate every allocation and free of the graph allocator.

ggml compiles this in with a #define; pyggml reads the environment variable at each reserve, so
it can be switched on in a running session. Messages go to stderr when the variable is set
(to anything but "" or "0") and always to the ``pyggml.alloc`` logger at DEBUG level.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("pyggml.alloc")


def env_enabled() -> bool:
    return os.environ.get("GGML_ALLOCATOR_DEBUG", "") not in ("", "0")


class AllocLog:
    """A switch decided once per reserve, so the hot path pays one attribute test when off."""

    def __init__(self) -> None:
        self.to_stderr = env_enabled()
        self.to_logger = logger.isEnabledFor(logging.DEBUG)
        self.on = self.to_stderr or self.to_logger

    def __call__(self, msg: str) -> None:
        if self.to_stderr:
            print(f"gallocr: {msg}", file=sys.stderr)
        if self.to_logger:
            logger.debug(msg)
