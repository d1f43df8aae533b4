"""A sequence's KV cells as bytes, in llama.cpp's sequence-state format (llama_state_seq_*).

Per cache (the base one, then the sliding-window one): ``u32 n_stream``, then per stream ``u32
cell_count`` and, when it is not 0, the cells' metadata (``i32 pos, u32 n_seq_id, i32 seq_id...``)
followed by their data: ``u32 v_trans, u32 n_layer``, per layer ``i32 k_type, u64 k_row_size`` and
the K rows of each run of consecutive cells; V the same way, or when V is transposed ``i32 v_type, u32
v_element_size, u32 n_embd_v_gqa`` and, per element j, the run's elements j (llama-kv-cache.cpp
state_write/state_read). A file (llama_state_seq_save_file) starts with ``u32 magic 'ggsq', u32
version 3, u32 n_tokens`` and the tokens (i32) the sequence holds.

Reading a sequence back finds free cells for it as a ubatch would, at the saved positions, so a
prompt's cells can be saved once and restored into any sequence of a context of the same model.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np

from ..backend.api import backend_tensor_get, backend_tensor_set
from ..gguf.tempfiles import temp_beside
from ..tensor import Tensor
from .kv_cache import KVCache, seq_bit
from .memory_recurrent import RecurrentMemory, StateError

__all__ = ["StateError", "load_seq_file", "save_seq_file", "seq_state_bytes", "set_seq_state"]

STATE_SEQ_MAGIC = 0x67677371  # 'ggsq'
STATE_SEQ_VERSION = 3


def _runs(cells: np.ndarray) -> list[tuple[int, int]]:
    """[first, end) of each run of consecutive cell indices."""
    if cells.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [cells.size]))
    return [(int(cells[a]), int(cells[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]


def _row_tensors(cache: KVCache) -> list[tuple[int, Tensor, int, str]]:
    """(layer, tensor, row bytes, name) of what is saved cell by cell: every K, then every V unless V is
    transposed (then saved element by element, see _v_planes)."""
    hp = cache.hp
    rows = [(il, cache.k[il], cache.k[il].type.row_size(hp.n_embd_k_gqa(il)), "K") for il in cache.layer_ids]
    if not cache.v_trans:
        rows += [(il, cache.v[il], cache.v[il].type.row_size(hp.n_embd_v_gqa(il)), "V") for il in cache.layer_ids]
    return rows


def _v_plane(cache: KVCache, il: int, st: int) -> np.ndarray:
    """Stream st of layer il's transposed V as bytes [n_embd_v_gqa, cells * element size]."""
    v = cache.v[il]
    return backend_tensor_get(v, offset=st * v.nb[2], size=v.nb[2]).reshape(cache.hp.n_embd_v_gqa(il), -1)


def write_cache(cache: KVCache, seq_id: int, out: io.BufferedIOBase | io.BytesIO) -> None:
    """llama_kv_cache::state_write for one sequence (seq_id < 0: every cell of every sequence)."""
    out.write(struct.pack("<I", cache.n_stream))
    for st in range(cache.n_stream):
        pos, seq = cache.pos[st], cache.seq[st]
        keep = pos >= 0
        if seq_id >= 0:
            keep &= (seq & seq_bit(seq_id)) != 0
            if cache.n_swa and keep.any():  # cells out of the sequence's window are not saved
                keep &= ~np.asarray(cache.is_masked_swa(pos, int(pos[keep].max())))
        cells = np.flatnonzero(keep)
        out.write(struct.pack("<I", cells.size))
        if cells.size == 0:
            continue
        for c in cells:  # metadata
            ids = [seq_id] if seq_id >= 0 else [s for s in range(cache.n_seq_max) if int(seq[c]) >> s & 1]
            out.write(struct.pack(f"<iI{len(ids)}i", int(pos[c]), len(ids), *ids))
        runs = _runs(cells)
        out.write(struct.pack("<II", int(cache.v_trans), len(cache.layer_ids)))
        for _, t, row, _ in _row_tensors(cache):
            out.write(struct.pack("<iQ", int(t.type), row))
            for a, b in runs:
                out.write(backend_tensor_get(t, offset=st * t.nb[2] + a * row, size=(b - a) * row).tobytes())
        if cache.v_trans:
            for il in cache.layer_ids:
                v, el = cache.v[il], cache.v[il].type.type_size
                plane = _v_plane(cache, il, st)
                out.write(struct.pack("<iII", int(v.type), el, plane.shape[0]))
                for j in range(plane.shape[0]):
                    for a, b in runs:
                        out.write(plane[j, a * el : b * el].tobytes())


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.data):
            raise StateError(f"the sequence state is truncated: {n} bytes wanted at offset {self.at}, "
                             f"{len(self.data) - self.at} left")
        b = self.data[self.at : self.at + n]
        self.at += n
        return b

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


def read_cache(cache: KVCache, seq_id: int, r: _Reader) -> None:
    """llama_kv_cache::state_read into sequence ``seq_id``: its cells are dropped, the saved ones placed
    in free cells of its stream and their K/V rows written there."""
    (n_stream,) = r.unpack("<I")
    if n_stream != cache.n_stream:
        raise StateError(f"the state has {n_stream} KV stream(s), the {cache.name} cache {cache.n_stream} "
                         "(a unified cache and one with a stream per sequence do not mix)")
    st = cache.stream_of(seq_id)
    for _ in range(n_stream):
        (cell_count,) = r.unpack("<I")
        if cell_count == 0:
            continue
        if cell_count > cache.size:
            raise StateError(f"the state holds {cell_count} cells, the {cache.name} cache has {cache.size}")
        cache.seq_rm(seq_id)
        positions = np.empty(cell_count, dtype=np.int64)
        for i in range(cell_count):
            p, n_ids = r.unpack("<iI")
            if n_ids != 1:
                raise StateError(f"cell {i} of the state belongs to {n_ids} sequences: only a single sequence's "
                                 "state can be read into a sequence")
            r.unpack("<i")
            positions[i] = p
        slots = cache.find_slot(np.full(cell_count, seq_id, dtype=np.int64))
        cache.apply(slots, positions, np.full(cell_count, seq_bit(seq_id), dtype=np.uint64))
        cells = np.asarray(slots[0][1], dtype=np.int64)
        try:
            _read_data(cache, st, cells, r)
        except BaseException:
            cache.seq_rm(seq_id)
            raise


def _read_data(cache: KVCache, st: int, cells: np.ndarray, r: _Reader) -> None:
    # row i of the state goes to cells[i]: runs of consecutive cells take consecutive rows
    runs = _runs(cells)
    v_trans, n_layer = r.unpack("<II")
    if n_layer != len(cache.layer_ids):
        raise StateError(f"the state has {n_layer} layers in the {cache.name} cache, the model {len(cache.layer_ids)}")
    if bool(v_trans) != cache.v_trans:
        raise StateError("the state's V cache is " + ("" if v_trans else "not ") + "transposed and this "
                         "context's is " + ("" if cache.v_trans else "not ") + "(flash attention differs)")
    for il, t, row, name in _row_tensors(cache):
        ty, saved_row = r.unpack("<iQ")
        if ty != int(t.type) or saved_row != row:
            raise StateError(f"layer {il}: the state's {name} rows are type {ty}, {saved_row} bytes; the cache's "
                             f"{t.type.name}, {row} bytes")
        for a, b in runs:
            backend_tensor_set(t, np.frombuffer(r.take((b - a) * row), np.uint8), st * t.nb[2] + a * row)
    if not cache.v_trans:
        return
    for il in cache.layer_ids:
        v, el = cache.v[il], cache.v[il].type.type_size
        plane = _v_plane(cache, il, st)
        ty, saved_el, n_e = r.unpack("<iII")
        if ty != int(v.type) or saved_el != el or n_e != plane.shape[0]:
            raise StateError(f"layer {il}: the state's V is type {ty} x {n_e}; the cache's {v.type.name} x "
                             f"{plane.shape[0]}")
        for j in range(n_e):
            for a, b in runs:
                plane[j, a * el : b * el] = np.frombuffer(r.take((b - a) * el), np.uint8)
        backend_tensor_set(v, plane.reshape(-1), st * v.nb[2])


def seq_state_bytes(caches: dict[str, KVCache], seq_id: int, recr: RecurrentMemory | None = None) -> bytes:
    """The KV caches' cells, then (recurrent and hybrid models) the recurrent memory's (llama_memory_hybrid's
    order: attention first)."""
    buf = io.BytesIO()
    for cache in caches.values():
        write_cache(cache, seq_id, buf)
    if recr is not None:
        recr.state_write(seq_id, buf)
    return buf.getvalue()


def set_seq_state(caches: dict[str, KVCache], seq_id: int, data: bytes | memoryview,
                  recr: RecurrentMemory | None = None) -> int:
    """Read a sequence state into seq_id; returns the bytes read. On failure seq_id holds nothing."""
    r = _Reader(data)
    try:
        for cache in caches.values():
            read_cache(cache, seq_id, r)
        if recr is not None:
            recr.state_read(seq_id, r)
    except BaseException:
        _forget(caches, seq_id, recr)
        raise
    return r.at


def _forget(caches: dict[str, KVCache], seq_id: int, recr: RecurrentMemory | None) -> None:
    for cache in caches.values():
        cache.seq_rm(seq_id)
    if recr is not None:
        recr.seq_rm(seq_id, -1, -1)


def save_seq_file(path: str | os.PathLike, caches: dict[str, KVCache], seq_id: int, tokens: list[int],
                  recr: RecurrentMemory | None = None) -> int:
    """llama_state_seq_save_file, written atomically (a temporary file renamed over ``path``)."""
    body = seq_state_bytes(caches, seq_id, recr)
    head = struct.pack(f"<III{len(tokens)}i", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(tokens), *tokens)
    path = Path(path)
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(head) + len(body)


def load_seq_file(path: str | os.PathLike, caches: dict[str, KVCache], seq_id: int,
                  recr: RecurrentMemory | None = None) -> list[int]:
    """llama_state_seq_load_file: the sequence's cells restored into seq_id; returns the saved tokens."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise StateError(f"cannot read the sequence state {path}: {e.strerror}") from e
    r = _Reader(data)
    magic, version = r.unpack("<II")
    if magic != STATE_SEQ_MAGIC or version != STATE_SEQ_VERSION:
        raise StateError(f"{path} is not a sequence state file of version {STATE_SEQ_VERSION}: magic {magic:08x}, "
                         f"version {version:08x}")
    (n_tokens,) = r.unpack("<I")
    if 4 * n_tokens > len(data) - r.at:
        raise StateError(f"{path}: {n_tokens} tokens announced, the file holds fewer")
    tokens = list(r.unpack(f"<{n_tokens}i"))
    n = set_seq_state(caches, seq_id, r.data[r.at :], recr)
    if r.at + n != len(data):
        _forget(caches, seq_id, recr)
        raise StateError(f"{path}: {len(data) - r.at - n} bytes left after the sequence state")
    return tokens
