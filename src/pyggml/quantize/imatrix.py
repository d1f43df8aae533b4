"""Collecting an importance matrix (llama-imatrix's ``IMatrixCollector``) through a context's eval callback.

For every matrix multiplication whose weight is a ``blk.*`` tensor (and ``output.weight`` with
``process_output``) and whose activations have at least 16 rows, the collector adds each activation
column's squares to the weight's sums and the row count to its count, in float32 and row order as
llama.cpp does. Usable on any :class:`~pyggml.llm.context.LlamaContext`::

    col = IMatrixCollector(chunk_size=512)
    with col.attach(ctx):
        ctx.decode(tokens, outputs=[True] * len(tokens))
    save_imatrix(col.result(["my-text.txt"]), "imatrix.gguf")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np

from ..ops.enums import Op
from ..types import GGMLType
from .errors import QuantizeError
from .imatrix_io import IMatrix, IMatrixEntry


def filter_tensor_name(name: str) -> str:
    """``CUDA0#blk.0.attn_k.weight#0`` -> ``blk.0.attn_k.weight`` (backend copies carry such names)."""
    if "#" in name:
        rest = name.split("#", 1)[1]
        return rest.split("#", 1)[0]
    return name


@numba.njit(cache=True, nogil=True)
def _add_squares(acc: np.ndarray, x: np.ndarray) -> None:
    """``acc += row * row`` for each row of ``x`` in turn, in float32 (llama-imatrix's order: each column's
    squares added row by row, the product rounded before the sum; no fused multiply-add). Compiled: the numpy
    loop of two calls per row cost a second per 2048-token batch of Gemma 3 270M (~130 products of 512 rows)."""
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[r, j]
            acc[j] += v * v


class _Stats:
    __slots__ = ("counts", "values")

    def __init__(self) -> None:
        self.values: np.ndarray | None = None
        self.counts: list[int] = []


class IMatrixCollector:
    """Per weight: float32 sums of squared activations per column (per expert matrix) and row counts."""

    def __init__(self, chunk_size: int = 512, process_output: bool = False) -> None:
        if chunk_size <= 0:
            raise QuantizeError(f"chunk size must be > 0, got {chunk_size}")
        self.chunk_size = chunk_size
        self.process_output = process_output
        self.stats: dict[str, _Stats] = {}
        self.datasets: list[str] = []
        self.last_chunk = 0
        # the activations seen in the graph being computed (id -> tensor), or None when no context announced
        # a graph (begin_graph): a product reading one of them is collected when asked, without a cut there
        self._seen: dict[int, Any] | None = None

    # ------------------------------------------------------------------ the callback
    def wants(self, t: Any) -> bool:
        """The ``ask`` half of llama-imatrix's callback."""
        if t.op == Op.MUL_MAT_ID:
            return True
        if t.op != Op.MUL_MAT:
            return False
        src0, src1 = t.src[0], t.src[1]
        if src1 is None or src1.ne[1] < 16 or src1.type != GGMLType.F32:
            return False
        w = filter_tensor_name(src0.name)
        return w.startswith("blk.") or (self.process_output and w == "output.weight")

    def begin_graph(self) -> None:
        """Called by the context before each graph computes: no activation of this graph is computed yet."""
        self._seen = {}

    def __call__(self, t: Any, ask: bool) -> bool:
        if ask:
            if not self.wants(t):
                return False
            seen = self._seen
            if seen is not None and t.op == Op.MUL_MAT and seen.get(id(t.src[1])) is t.src[1]:
                # attn_k and attn_v read the attn_q's input, ffn_up the ffn_gate's: computed already, so collected
                # now; the graph is cut only at the first reader (~75 pieces a Gemma 3 ubatch instead of ~130)
                self._collect(t)
                return False
            return True
        if t.op == Op.MUL_MAT_ID:
            self._collect_id(t)
        else:
            self._collect(t)
            if self._seen is not None:
                self._seen[id(t.src[1])] = t.src[1]
        return True

    def _activations(self, src1: Any) -> np.ndarray:
        """src1's float32 data as [ne3, ne2, ne1, ne0]: a view when it lives on the host, else a copy."""
        from ..llm.context import tensor_to_numpy

        if (src1.buffer is None or src1.buffer.is_host()) and src1.type == GGMLType.F32:
            return src1.view4()
        return tensor_to_numpy(src1).reshape(src1.ne[3], src1.ne[2], src1.ne[1], src1.ne[0])

    def _collect(self, t: Any) -> None:
        src0, src1 = t.src[0], t.src[1]
        name = filter_tensor_name(src0.name)
        e = self.stats.setdefault(name, _Stats())
        n_mat = src0.ne[2] * src0.ne[3]
        ne0 = src1.ne[0]
        if len(e.counts) > 1 and all(c == e.counts[0] for c in e.counts):
            e.counts = e.counts[:1]
        if e.values is None:
            e.values = np.zeros(ne0 * n_mat, dtype=np.float32)
            e.counts = [0]
        elif e.values.size != ne0 * n_mat:
            raise QuantizeError(f"inconsistent size for {name} ({e.values.size} vs {ne0 * n_mat})")
        x = self._activations(src1)
        acc = e.values.reshape(n_mat, ne0)
        for i3 in range(src1.ne[3]):
            for i2 in range(src1.ne[2]):
                mat = (i3 % src0.ne[3]) * src0.ne[2] + (i2 % src0.ne[2])
                _add_squares(acc[mat], np.ascontiguousarray(x[i3, i2]))  # row by row: llama.cpp's order
        if not np.all(np.isfinite(e.values)):
            raise QuantizeError(f"non-finite values detected in {name}")
        n_rows = src1.ne[1] * src1.ne[2] * src1.ne[3]
        for i in range(len(e.counts)):
            e.counts[i] += n_rows // n_mat
            self.last_chunk = max(self.last_chunk, e.counts[i] // self.chunk_size)

    def _collect_id(self, t: Any) -> None:
        src0, src1, ids = t.src[0], t.src[1], t.src[2]
        name = filter_tensor_name(src0.name)
        n_as, ne0 = src0.ne[2], src1.ne[0]
        e = self.stats.setdefault(name, _Stats())
        if len(e.counts) == 1 and n_as > 1:
            e.counts = e.counts * n_as
        if e.values is None:
            e.values = np.zeros(ne0 * n_as, dtype=np.float32)
            e.counts = [0] * n_as
        elif e.values.size != ne0 * n_as or len(e.counts) != n_as:
            raise QuantizeError(f"inconsistent size for {name}")
        x = self._activations(src1)[0]  # [n_tokens, n_expert_used or 1, ne0]
        idx = np.asarray(ids.to_float()).astype(np.int64).reshape(ids.ne[1], ids.ne[0])  # [n_tokens, n_ids]
        acc = e.values.reshape(n_as, ne0)
        for k in range(ids.ne[0]):
            for row in range(ids.ne[1]):
                ex = int(idx[row, k])
                xr = x[row, k % src1.ne[1]]
                e.counts[ex] += 1
                acc[ex] += xr * xr
        if not np.all(np.isfinite(e.values)):
            raise QuantizeError(f"non-finite values detected in {name}")
        for c in e.counts:
            self.last_chunk = max(self.last_chunk, c // self.chunk_size)

    @contextmanager
    def attach(self, ctx: Any) -> Iterator[IMatrixCollector]:
        """Install as ``ctx``'s eval callback for the duration of the block."""
        previous = ctx.eval_callback
        ctx.eval_callback = self
        try:
            yield self
        finally:
            ctx.eval_callback = previous

    # ------------------------------------------------------------------ files
    def add(self, im: IMatrix) -> None:
        """Accumulate a loaded file (llama-imatrix ``--in-file``): GGUF sums/counts add; legacy
        averages are scaled back by the chunk size."""
        for name, entry in im.entries.items():
            e = self.stats.setdefault(name, _Stats())
            sums = np.asarray(entry.sums, dtype=np.float32)
            if im.is_legacy:
                if e.values is None:
                    e.values = np.zeros(sums.size, dtype=np.float32)
                    e.counts = [0]
                e.values += sums * np.float32(self.chunk_size)
                e.counts = [c + int(entry.counts[0]) * self.chunk_size for c in e.counts]
                continue
            if e.values is None:
                e.values = np.zeros(sums.size, dtype=np.float32)
            elif e.values.size != sums.size:
                raise QuantizeError(f"mismatched sums size for {name}: {sums.size} != {e.values.size}")
            n = len(entry.counts)
            if not e.counts:
                e.counts = [0] * n
            elif len(e.counts) == 1 and n > 1:
                e.counts = e.counts * n
            elif len(e.counts) != n:
                raise QuantizeError(f"mismatched counts size for {name}: {n} != {len(e.counts)}")
            e.values += sums
            e.counts = [a + int(b) for a, b in zip(e.counts, entry.counts, strict=True)]
        self.datasets.extend(im.datasets)
        max_count = max((c for s in self.stats.values() for c in s.counts), default=0)
        self.last_chunk = max_count // self.chunk_size

    def result(self, datasets: list[str] | None = None) -> IMatrix:
        """The collected statistics as an :class:`IMatrix` (``datasets`` appended to the loaded ones)."""
        im = IMatrix(datasets=[*self.datasets, *(datasets or [])], chunk_count=self.last_chunk,
                     chunk_size=self.chunk_size, has_metadata=True)
        for name, s in self.stats.items():
            if s.values is not None and s.counts:
                im.entries[name] = IMatrixEntry(s.values.copy(), np.array(s.counts, dtype=np.int64))
        return im
