"""``POST /slots/{id}?action=save|restore|erase``: a slot's KV cache to a file and back (``--slot-save-path``).

As llama-server: the file holds the slot's sequence state and its tokens (LlamaContext's
state_seq_save_file, llama.cpp's layout), named by the request's ``filename`` inside the save
directory (a name, never a path); an action on a busy slot waits until its task is done; restoring
puts the tokens back as the slot's cache, so the next prompt sharing their prefix reuses them. The
token list in the file is packed as llama-server packs it (server_tokens::serialize: a -1 marker, version
1, the tokens, no media), so the files of either server restore in the other; a plain list (older
llama-server files) is read too.
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..llm.state import StateError
from .app import ServerState, read_body
from .engine import DEFER, Engine
from .errors import APIError, ErrorType
from .schemas import _CONFIG, parse

#: server_tokens::serialize's marker and SERVER_TOKENS_STATE_VERSION
_PACKED_MARKER, _PACKED_VERSION = -1, 1

_ILLEGAL = set(':*?"<>|/\\') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


class SlotFileRequest(BaseModel):
    model_config = _CONFIG
    filename: str = ""


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename without subdirectories: a plain file name, no separators, control
    characters, characters Windows forbids, "..", or leading/trailing space (or trailing period)."""
    if not name or len(name.encode("utf-8", errors="replace")) > 255:
        return False
    for c in name:
        if c in _ILLEGAL or unicodedata.category(c) in ("Cc", "Cs"):
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name)


async def slot_action(request: Request, state: ServerState) -> Response:
    if not state.slot_save_path:
        raise APIError("This server does not support slots action. Start it with `--slot-save-path`",
                       ErrorType.NOT_SUPPORTED)
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise APIError("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise APIError("Invalid action")
    raw = await read_body(request, state.max_body)
    filename = ""
    if action != "erase":
        filename = parse(raw, SlotFileRequest).filename
        if not valid_filename(filename):
            raise APIError("Invalid filename")
    engine = state.engine
    if not 0 <= id_slot < len(engine.slots):
        raise APIError("Invalid slot ID")
    path = Path(state.slot_save_path) / filename
    work = {"save": _save, "restore": _restore, "erase": _erase}[action]
    result = await asyncio.wrap_future(engine.call(lambda: work(engine, id_slot, path)))
    return JSONResponse(result)


def pack_tokens(tokens: list[int]) -> list[int]:
    """llama-server's packed token list: marker, version, the tokens with their count, no media keys."""
    return [_PACKED_MARKER, _PACKED_VERSION, len(tokens), *tokens, 0]


def unpack_tokens(packed: list[int]) -> list[int]:
    """The tokens of a packed list (or of a plain one, which has no marker); ValueError if malformed."""
    if not packed or packed[0] != _PACKED_MARKER:
        return packed
    if len(packed) < 3 or packed[1] != _PACKED_VERSION:
        raise ValueError("Unsupported server tokens state version")
    n = packed[2]
    if not 0 <= n <= len(packed) - 4:
        raise ValueError("Cannot read the tokens of the server tokens state")
    if packed[3 + n] != 0:
        raise ValueError("Cannot restore media tokens without an mmproj")
    if len(packed) != n + 4:
        raise ValueError("Trailing data in server tokens state")
    return packed[3:3 + n]


def _save(engine: Engine, id_slot: int, path: Path) -> Any:
    s = engine.slots[id_slot]
    if s.task is not None:
        return DEFER
    t0 = time.perf_counter()
    try:
        n = engine.ctx.state_seq_save_file(path, s.id, pack_tokens(s.cached))
    except OSError as e:
        raise APIError(f"Unable to save slot: {e.strerror}", ErrorType.SERVER) from None
    return {"id_slot": id_slot, "filename": path.name, "n_saved": len(s.cached), "n_written": n,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def _restore(engine: Engine, id_slot: int, path: Path) -> Any:
    s = engine.slots[id_slot]
    if s.task is not None:
        return DEFER
    t0 = time.perf_counter()
    try:
        tokens = unpack_tokens(engine.ctx.state_seq_load_file(path, s.id))
        if len(tokens) > s.n_ctx:
            raise ValueError("Restored prompt does not fit in the slot context")
        if any(not 0 <= t < engine.vocab.n_tokens for t in tokens):
            raise ValueError("Invalid tokens in slot save file")
    except (OSError, ValueError, StateError) as e:
        engine.ctx.seq_rm(s.id, -1, -1)
        s.cached = []
        why = e.args[0] if type(e) is ValueError else \
            "No available space in KV cache or invalid slot save file"
        raise APIError(f"Unable to restore slot: {why}") from None
    s.cached = list(tokens)
    return {"id_slot": id_slot, "filename": path.name, "n_restored": len(tokens), "n_read": path.stat().st_size,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def _erase(engine: Engine, id_slot: int, path: Path) -> Any:
    s = engine.slots[id_slot]
    if s.task is not None:
        return DEFER
    n = len(s.cached)
    engine.ctx.seq_rm(s.id, -1, -1)
    s.cached = []
    return {"id_slot": id_slot, "n_erased": n}
