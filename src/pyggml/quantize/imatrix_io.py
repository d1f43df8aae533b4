"""Importance-matrix files: llama-imatrix's GGUF format (read, write, combine) and the legacy ``.dat``.

GGUF layout (tools/imatrix/imatrix.cpp ``save_imatrix``): keys ``general.type = "imatrix"``,
``imatrix.datasets`` (string array), ``imatrix.chunk_count`` and ``imatrix.chunk_size`` (u32); per
weight two F32 tensors, ``NAME.in_sum2`` (ne = [n_per_row, n_mat], the raw sums of squared
activations) and ``NAME.counts`` (ne = [1, n_mat], how many activation rows were summed), names sorted.
The legacy ``.dat`` stores per weight the *average* times the call count, plus that count.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..gguf import GGUFError, GGUFReader, GGUFValueType, GGUFWriter
from ..gguf.constants import Keys
from ..types import GGMLType
from .errors import QuantizeError

KEY_DATASETS = Keys.IMATRIX_DATASETS
KEY_CHUNK_COUNT = Keys.IMATRIX_CHUNK_COUNT
KEY_CHUNK_SIZE = Keys.IMATRIX_CHUNK_SIZE


@dataclass
class IMatrixEntry:
    """One weight's statistics: ``sums`` float32 (n_mat * n_per_row), ``counts`` int64 (n_mat)."""

    sums: np.ndarray
    counts: np.ndarray


@dataclass
class IMatrix:
    """A loaded or collected importance matrix (``common_imatrix``)."""

    entries: dict[str, IMatrixEntry] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False
    has_metadata: bool = False

    def for_quantize(self) -> dict[str, np.ndarray]:
        """Per weight the mean squared activation (``ggml_quantize_chunk``'s weights), as llama-quantize loads it.

        GGUF: ``sums / count`` per matrix (1 where a matrix got no rows); legacy: ``sums / ncall``.
        """
        out: dict[str, np.ndarray] = {}
        for name, e in self.entries.items():
            sums = np.asarray(e.sums, dtype=np.float32)
            if not self.is_legacy:
                n = len(e.counts)
                per = sums.reshape(n, -1)
                res = np.ones_like(per)
                for j, c in enumerate(e.counts):
                    cf = np.float32(c)
                    if cf > 0:
                        res[j] = per[j] / cf
                out[name] = res.reshape(-1)
            else:
                ncall = int(e.counts[0]) if len(e.counts) else 0
                out[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
        return out


def load_imatrix(path: str | os.PathLike[str]) -> IMatrix:
    """``common_imatrix_load``: a GGUF imatrix, or else the legacy ``.dat`` format."""
    p = Path(path)
    if not p.is_file():
        raise QuantizeError(f"cannot read imatrix file {str(p)!r}: no such file")
    try:
        r = GGUFReader(p)
    except GGUFError:
        return _load_legacy(p)
    with r:
        if len(r.tensors) < 1:
            raise QuantizeError(f"no data in imatrix file {str(p)!r}")
        im = IMatrix()
        ds = r.kv(KEY_DATASETS) if KEY_DATASETS in r else None
        if ds is not None and ds.is_array and ds.type == GGUFValueType.STRING:
            im.datasets = [str(s) for s in r[KEY_DATASETS]]
        im.has_metadata = KEY_DATASETS in r and KEY_CHUNK_COUNT in r and KEY_CHUNK_SIZE in r
        im.chunk_count = int(r.get_u32(KEY_CHUNK_COUNT)) if KEY_CHUNK_COUNT in r else 0
        im.chunk_size = int(r.get_u32(KEY_CHUNK_SIZE)) if KEY_CHUNK_SIZE in r else 0
        pairs: dict[str, list] = {}
        for ti in r.tensors:
            for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
                if ti.name.endswith(suffix):
                    pairs.setdefault(ti.name[: -len(suffix)], [None, None])[slot] = ti
        for name in sorted(pairs, key=str.encode):
            s, c = pairs[name]
            if s is None or c is None:
                raise QuantizeError(f"imatrix {str(p)!r}: mismatched sums and counts for {name}")
            if s.type != GGMLType.F32 or c.type != GGMLType.F32:
                raise QuantizeError(f"imatrix {str(p)!r}: sums and counts for {name} must be F32")
            sums = np.array(r.tensor_data(s.name), dtype=np.float32).reshape(-1)
            counts = np.rint(np.array(r.tensor_data(c.name), dtype=np.float64).reshape(-1)).astype(np.int64)
            im.entries[name] = IMatrixEntry(sums, counts)
    return im


def _load_legacy(p: Path) -> IMatrix:
    data = p.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise QuantizeError(f"imatrix {str(p)!r} is neither GGUF nor a complete legacy .dat file")
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise QuantizeError(f"no data in imatrix file {str(p)!r}")
    im = IMatrix(is_legacy=True)
    for _ in range(n_entries):
        (ln,) = take("<i")
        if ln < 0 or pos + ln > len(data):
            raise QuantizeError(f"imatrix {str(p)!r}: bad name length {ln}")
        name = data[pos : pos + ln].split(b"\0")[0].decode("utf-8", "replace")
        pos += ln
        ncall, nval = take("<ii")
        if nval < 1:
            raise QuantizeError(f"imatrix {str(p)!r}: bad number of values {nval} for {name}")
        if pos + 4 * nval > len(data):
            raise QuantizeError(f"imatrix {str(p)!r}: truncated data for {name}")
        sums = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        im.entries[name] = IMatrixEntry(sums, np.array([ncall], dtype=np.int64))
    if pos + 4 <= len(data):
        (im.chunk_count,) = take("<i")
        if pos + 4 <= len(data):
            (ln,) = take("<i")
            if ln > 0 and pos + ln <= len(data):
                im.datasets.append(data[pos : pos + ln].split(b"\0")[0].decode("utf-8", "replace"))
    return im


def save_imatrix(im: IMatrix, path: str | os.PathLike[str]) -> Path:
    """Write ``im`` in llama-imatrix's GGUF format (atomically)."""
    w = GGUFWriter()
    w.set_str(Keys.GENERAL_TYPE, "imatrix")
    w.set_arr(KEY_DATASETS, list(im.datasets), GGUFValueType.STRING)
    w.set_u32(KEY_CHUNK_COUNT, im.chunk_count)
    w.set_u32(KEY_CHUNK_SIZE, im.chunk_size)
    for name in sorted(im.entries, key=str.encode):
        e = im.entries[name]
        nmat = len(e.counts)
        if len(e.sums) == 0 or nmat == 0:
            continue
        sums = np.asarray(e.sums, dtype=np.float32).reshape(nmat, -1)
        w.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(sums))
        w.add_tensor(f"{name}.counts", np.asarray(e.counts, dtype=np.float32).reshape(nmat, 1))
    return w.write(path)


def save_imatrix_legacy(im: IMatrix, path: str | os.PathLike[str], dataset: str = "") -> Path:
    """Write ``im`` in llama-imatrix's legacy ``.dat`` format (``--output-format dat``), atomically.

    Per entry (sorted, skipping those without any data): name, ``ncall`` = the largest count over the chunk
    size rounded up, and ``sum / count * ncall`` per value (1 where a matrix got no rows); then the chunk
    count and ``dataset`` (llama-imatrix writes its ``-f`` file, else the last loaded dataset).
    """
    from ..gguf.tempfiles import temp_beside

    chunk = max(1, im.chunk_size)
    parts: list[bytes] = []
    n = 0
    for name in sorted(im.entries, key=str.encode):
        e = im.entries[name]
        counts = np.asarray(e.counts, dtype=np.int64)
        if counts.size == 0 or not counts.any():
            continue
        n += 1
        ncall = int((counts.max() + chunk - 1) // chunk)
        sums = np.asarray(e.sums, dtype=np.float32).reshape(counts.size, -1)
        c = counts.astype(np.float32)[:, None]
        vals = np.where(c == 0, np.float32(1), sums) / np.where(c == 0, np.float32(1), c) * np.float32(ncall)
        raw = name.encode()
        parts.append(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, sums.size))
        parts.append(vals.astype("<f4").tobytes())
    ds = (dataset or (im.datasets[-1] if im.datasets else "")).encode()
    body = struct.pack("<i", n) + b"".join(parts) + struct.pack("<ii", im.chunk_count, len(ds)) + ds
    target = Path(path)
    fd, tmp = temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
