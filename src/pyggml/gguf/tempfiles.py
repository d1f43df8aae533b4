"""Hidden temporary files beside a target, for writes that rename into place, and their clean-up.

A file written atomically is first a hidden ``.NAME.PID.RANDOM.tmp`` in the target's folder, renamed
over the target when complete. A writer killed with SIGKILL (or by a power cut) cannot remove its
temporary file, which for a quantized model is hundreds of MB; so each new write to the same target
first removes the temporary files of writers whose process is gone. The process id in the name is
what makes that safe: a temporary file of a live process (another writer of the same target right
now) is never touched. (In gguf/, the lowest layer that writes files: the GGUF writer, and llm's state
files and quantize's imatrix above it, use it.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return True  # unknown: keep the file
    return True


def stale_temps(target: Path) -> list[Path]:
    """The temporary files of ``target`` whose writing process no longer exists."""
    prefix = f".{target.name}."
    out = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    for p in entries:
        name = p.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid, sep, _ = name[len(prefix):-len(".tmp")].partition(".")
        if sep and pid.isdigit() and not _pid_alive(int(pid)) and p.is_file():
            out.append(p)
    return out


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files dead writers left beside ``target``; returns those removed."""
    removed = []
    for p in stale_temps(target):
        with contextlib.suppress(OSError):  # another writer may have removed it first
            p.unlink()
            removed.append(p)
    return removed


def temp_beside(target: Path) -> tuple[int, str]:
    """A new hidden temporary file next to ``target`` (after removing dead writers' leftovers):
    ``(fd, path)`` as ``tempfile.mkstemp`` returns them."""
    remove_stale_temps(target)
    return tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
