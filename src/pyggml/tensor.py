"""ggml's tensor: a lazy node with type, shape (ne), strides (nb), op, op_params, flags and sources.

Field meanings follow ``struct ggml_tensor`` (ggml.h:673-706). ``ne`` and ``nb`` are in ggml order
(``ne[0]`` is the fastest-moving dimension); ``numpy()`` presents the data in numpy order, i.e.
shape ``(ne[n-1], ..., ne[0])``. ``data`` is an integer address of real memory (see memory.py).
"""

from __future__ import annotations

from enum import IntFlag
from typing import TYPE_CHECKING, Any

import numpy as np

from . import memory
from .errors import NameTooLongError, PyGGMLError, ShapeError, TypeMismatchError
from .ops.enums import Op
from .types import GGMLType

if TYPE_CHECKING:
    from .context import Context

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_MEM_ALIGN = 16
#: sizeof(struct ggml_tensor) and sizeof(struct ggml_object) on 64-bit, for ggml's memory accounting
GGML_TENSOR_SIZE = 336
GGML_OBJECT_SIZE = 32


def ggml_pad(x: int, n: int) -> int:
    """GGML_PAD: round x up to a multiple of n (a power of two)."""
    return (x + n - 1) & ~(n - 1)


class TensorFlag(IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


#: TensorFlag's bits as plain ints, which Tensor.flags holds: a graph's building and planning test them thousands of
#: times, and an IntFlag operand makes every ``&`` and ``|`` build a new enum value (about a tenth of a new graph
#: shape's Python); ``flags & TensorFlag.X`` still works
FLAG_INPUT, FLAG_OUTPUT, FLAG_PARAM, FLAG_LOSS, FLAG_COMPUTE = (int(f) for f in (
    TensorFlag.INPUT, TensorFlag.OUTPUT, TensorFlag.PARAM, TensorFlag.LOSS, TensorFlag.COMPUTE))


class NoDataError(PyGGMLError, RuntimeError):
    """The tensor has no memory yet (a no_alloc context, or not yet allocated)."""


_BF16 = GGMLType.BF16


class Tensor:
    """One ggml tensor. Created by a Context or an op builder, never directly."""

    __slots__ = (
        "__weakref__",
        "_v4",
        "buffer",
        "ctx",
        "data",
        "extra",
        "flags",
        "name",
        "nb",
        "ne",
        "op",
        "op_params",
        "src",
        "type",
        "view_offs",
        "view_src",
    )

    def __init__(
        self,
        ctx: Context | None,
        type: GGMLType,
        ne: list[int],
        view_src: Tensor | None = None,
        view_offs: int = 0,
        data: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.type = type
        self.buffer: Any = None
        self.ne = list(ne) + [1] * (GGML_MAX_DIMS - len(ne))
        ts, bs = type.type_size, type.blck_size
        nb0 = ts
        nb1 = nb0 * (self.ne[0] // bs)
        self.nb = [nb0, nb1, nb1 * self.ne[1], nb1 * self.ne[1] * self.ne[2]]
        self.op = Op.NONE
        self.op_params = np.zeros(GGML_MAX_OP_PARAMS // 4, dtype=np.int32)
        self.flags = 0
        self.src: list[Tensor | None] = [None] * GGML_MAX_SRC
        self.view_src = view_src
        self.view_offs = view_offs
        self.data = data
        self.name = ""
        self.extra: Any = None
        self._v4: tuple[tuple, np.ndarray] | None = None  # view4's last (key, view)

    # ------------------------------------------------------------------ op params
    @property
    def op_params_f32(self) -> np.ndarray:
        """The op_params as 16 float32 (a view: writes go through)."""
        return self.op_params.view(np.float32)

    def get_op_params_i32(self, i: int) -> int:
        return int(self.op_params[i])

    def get_op_params_f32(self, i: int) -> float:
        return float(self.op_params.view(np.float32)[i])

    def set_op_params_i32(self, i: int, value: int) -> None:
        self.op_params[i] = value

    def set_op_params_f32(self, i: int, value: float) -> None:
        self.op_params.view(np.float32)[i] = value

    def set_op_params(self, params: list[int | float] | bytes) -> None:
        """Write op_params from the start: ints as int32, floats as float32, or raw bytes."""
        if isinstance(params, bytes | bytearray):
            if len(params) > GGML_MAX_OP_PARAMS:
                raise ValueError("op_params are at most 64 bytes")
            raw = self.op_params.view(np.uint8)
            raw[: len(params)] = np.frombuffer(params, dtype=np.uint8)
            return
        if len(params) > GGML_MAX_OP_PARAMS // 4:
            raise ValueError("op_params hold at most 16 values")
        for i, v in enumerate(params):
            if isinstance(v, float):
                self.set_op_params_f32(i, v)
            else:
                self.op_params[i] = int(v)

    # ------------------------------------------------------------------ naming
    def set_name(self, name: str) -> Tensor:
        """ggml_set_name. ggml truncates silently at 63 bytes; pyggml refuses instead."""
        if len(name.encode()) >= GGML_MAX_NAME:
            raise NameTooLongError(
                f"tensor name {name!r} is {len(name.encode())} bytes; ggml's limit is {GGML_MAX_NAME - 1}"
            )
        self.name = name
        return self

    def format_name(self, fmt: str, *args: object) -> Tensor:
        """ggml_format_name (printf-style)."""
        return self.set_name(fmt % args)

    def get_name(self) -> str:
        return self.name

    # ------------------------------------------------------------------ flags
    def set_input(self) -> None:
        self.flags |= FLAG_INPUT

    def set_output(self) -> None:
        """Mark as a graph output; as in ggml, the tensors it views are kept alive too."""
        t: Tensor | None = self
        while t is not None:
            t.flags |= FLAG_OUTPUT
            t = t.view_src

    def set_param(self) -> None:
        self.flags |= FLAG_PARAM

    def set_loss(self) -> None:
        self.flags |= FLAG_LOSS

    # ------------------------------------------------------------------ shape helpers
    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    def nbytes(self) -> int:
        """ggml_nbytes: the span of bytes from the first to one past the last element."""
        # unrolled: a new graph shape asks this of every tensor several times (a quarter of its build's Python)
        (ne0, ne1, ne2, ne3), (nb0, nb1, nb2, nb3) = self.ne, self.nb
        if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
            return 0
        rows = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
        bs = self.type.blck_size
        if bs == 1:
            return self.type.type_size + (ne0 - 1) * nb0 + rows
        return ne0 * nb0 // bs + rows

    def row_size(self) -> int:
        return self.type.row_size(self.ne[0])

    def element_size(self) -> int:
        return self.type.type_size

    def n_dims(self) -> int:
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    def is_empty(self) -> bool:
        return any(n == 0 for n in self.ne)

    def is_scalar(self) -> bool:
        return self.ne == [1, 1, 1, 1]

    def is_vector(self) -> bool:
        return self.ne[1] == 1 and self.ne[2] == 1 and self.ne[3] == 1

    def is_matrix(self) -> bool:
        return self.ne[2] == 1 and self.ne[3] == 1

    def is_3d(self) -> bool:
        return self.ne[3] == 1

    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    def _is_contiguous_n(self, n: int) -> bool:
        ts, bs = self.type.type_size, self.type.blck_size
        next_nb = ts
        if self.ne[0] != bs and self.nb[0] != next_nb:
            return False
        next_nb *= self.ne[0] // bs
        for i in range(1, GGML_MAX_DIMS):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != next_nb:
                        return False
                    next_nb *= self.ne[i]
                else:
                    next_nb = self.ne[i] * self.nb[i]
        return True

    def is_contiguous(self) -> bool:
        """ggml_is_contiguous (== _0): elements are laid out without gaps in ne order."""
        return self._is_contiguous_n(0)

    def is_contiguous_0(self) -> bool:
        return self._is_contiguous_n(0)

    def is_contiguous_1(self) -> bool:
        """Contiguous for dims >= 1 (rows may be spaced)."""
        return self._is_contiguous_n(1)

    def is_contiguous_2(self) -> bool:
        return self._is_contiguous_n(2)

    def is_contiguous_rows(self) -> bool:
        return self.ne[0] == self.type.blck_size or self.nb[0] == self.type.type_size

    def is_contiguously_allocated(self) -> bool:
        return self.nbytes() == self.nelements() * self.type.type_size // self.type.blck_size

    def is_view(self) -> bool:
        return self.view_src is not None

    # ------------------------------------------------------------------ data access
    def _host_bytes(self) -> tuple[np.ndarray, int]:
        if self.data is None:
            raise NoDataError(f"tensor {self.name!r} has no data (no_alloc context or not allocated)")
        buf = self.buffer
        if buf is not None and not buf.is_host():
            raise NoDataError(
                f"tensor {self.name!r} lives in non-host buffer {buf.name()!r}; "
                "use backend_tensor_get to copy it out"
            )
        return memory.find_region(self.data, self.nbytes())

    def view4(self) -> np.ndarray:
        """The data as a 4-d numpy view of shape (ne3, ne2, ne1, ne0) with ggml's strides.

        Quantized types give uint8 of shape (ne3, ne2, ne1, row_bytes) (rows must be contiguous);
        BF16 gives the raw uint16 bits. The view is cached while data, type, ne and nb stay the
        same (a reused graph computes every step through the same views).
        """
        key = (self.data, self.type, *self.ne, *self.nb, id(self.buffer))
        cached = self._v4
        if cached is not None and cached[0] == key:
            return cached[1]
        view = self._make_view4()
        self._v4 = (key, view)
        return view

    def _make_view4(self) -> np.ndarray:
        region, off = self._host_bytes()
        ne, nb = self.ne, self.nb
        tr = self.type.traits
        if tr.blck_size == 1:
            dtype = tr.np_dtype if self.type != _BF16 else np.dtype("<u2")
            shape = (ne[3], ne[2], ne[1], ne[0])
            strides = (nb[3], nb[2], nb[1], nb[0])
        else:
            if not self.is_contiguous_rows():
                raise ShapeError(f"quantized tensor {self.name!r} has non-contiguous rows")
            dtype = np.dtype(np.uint8)
            shape = (ne[3], ne[2], ne[1], self.row_size())
            strides = (nb[3], nb[2], nb[1], 1)
        if self.nelements() == 0:
            return np.zeros(shape, dtype=dtype)
        return np.ndarray(shape, dtype=dtype, buffer=region, offset=off, strides=strides)

    def numpy(self) -> np.ndarray:
        """A numpy view of the data, shape (ne[n_dims-1], ..., ne[0]), honouring nb.

        Writes through the view change the tensor. Quantized tensors give raw uint8 rows.
        """
        v = self.view4()
        return v.reshape(v.shape[GGML_MAX_DIMS - self._np_ndim() :])

    def to_float(self) -> np.ndarray:
        """The data converted to float32 (dequantized if quantized), numpy order."""
        from .tensor_data import to_f32_4d  # deferred: loads the quantizers (numba); import pyggml stays light

        v = to_f32_4d(self)
        return v.reshape(v.shape[GGML_MAX_DIMS - self._np_ndim() :])

    def set(self, array: Any) -> Tensor:
        """Write ``array`` into the tensor, checking its shape and type.

        The array's shape must equal the tensor's numpy shape (or have the same number of
        elements, for a flat array); its dtype must convert safely to the tensor's type
        (float32 data into an F16/BF16 tensor is rounded as ggml rounds it).
        """
        from .tensor_data import from_numpy_into  # deferred: loads numba (see to_float)

        from_numpy_into(self, array)
        return self

    def get_f32_1d(self, i: int) -> float:
        """ggml_get_f32_1d: element i in ggml's flat (contiguous) order."""
        return float(self.to_float().reshape(-1)[i])

    def set_f32(self, value: float) -> Tensor:
        """ggml_set_f32: fill every element with ``value``."""
        from .tensor_data import fill  # deferred: loads numba (see to_float)

        fill(self, value)
        return self

    # ------------------------------------------------------------------ python niceties
    def _np_ndim(self) -> int:
        """Dimensions numpy views keep: up to the last ne that is not 1 (an empty dim counts)."""
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if self.ne[i] != 1:
                return i + 1
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy-order shape of the tensor (ne reversed, trailing ne of 1 dropped as in ggml_n_dims)."""
        return tuple(reversed(self.ne[: self._np_ndim()]))

    def __repr__(self) -> str:
        ne = ", ".join(str(n) for n in self.ne[: self.n_dims()])
        return f"<Tensor {self.name!r} {self.type.type_name} [{ne}] op={self.op.name}>"

    if TYPE_CHECKING:  # the operators are attached by ops/operators.py (ops sits above tensor)

        def __add__(self, other: Tensor) -> Tensor: ...
        def __sub__(self, other: Tensor) -> Tensor: ...
        def __mul__(self, other: Tensor | float) -> Tensor: ...
        def __rmul__(self, other: float) -> Tensor: ...
        def __truediv__(self, other: Tensor) -> Tensor: ...
        def __matmul__(self, other: Tensor) -> Tensor: ...
        def __neg__(self) -> Tensor: ...

    def _ctx_for_op(self) -> Context:
        """The context an operator (``a + b``, see ops/operators.py) builds its node in."""
        if self.ctx is None:
            raise PyGGMLError(f"tensor {self.name!r} has no context to build ops in")
        return self.ctx


def check_same_type(op: str, *ts: Tensor) -> None:
    """Raise TypeMismatchError unless all tensors share one type."""
    if len({t.type for t in ts}) > 1:
        names = ", ".join(t.type.type_name for t in ts)
        raise TypeMismatchError(f"{op}: operands must have the same type, got {names}")


def are_same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def are_same_stride(a: Tensor, b: Tensor) -> bool:
    return a.nb == b.nb


def are_same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat: t0 can be tiled to t1's shape."""
    if t0.is_empty():
        return t1.is_empty()
    return all(t1.ne[i] % t0.ne[i] == 0 for i in range(GGML_MAX_DIMS))


def can_repeat_rows(t0: Tensor, t1: Tensor) -> bool:
    return t0.ne[0] == t1.ne[0] and can_repeat(t0, t1)
