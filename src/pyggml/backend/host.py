"""Facts about the host machine that more than one backend reports.

The host's memory is what ggml's CPU device reports as its free/total memory, and what a torch
device on the CPU reports too (both compute in host RAM).
"""

from __future__ import annotations

import os


def system_memory() -> tuple[int, int]:
    """(free, total) bytes of host RAM, as ggml_backend_cpu_device_get_memory reports them; (0, 0)
    where the platform cannot say."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return 0, 0
