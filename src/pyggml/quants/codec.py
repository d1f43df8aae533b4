"""The codec contract every ggml quantization type implements, and the registry of codecs.

One class per ggml type (DESIGN.md: "a quant type once"). A codec works on whole rows:
``quantize`` maps float32 ``(n_rows, n_per_row)`` to uint8 ``(n_rows, row_bytes)`` exactly as
``ggml_quantize_chunk`` does, and ``dequantize`` maps them back exactly as ggml's ``to_float``.
"""

from __future__ import annotations

import numpy as np

from ..errors import PyGGMLError
from ..types import QK_K, GGMLType, row_size
from .chunks import for_row_chunks


class QuantError(PyGGMLError, ValueError):
    """Bad input to a quantizer or dequantizer (shape, type, missing imatrix...)."""


class QuantRowError(QuantError):
    """A row that cannot be quantized (where ggml aborts): ``row`` counts from the first row given to
    :meth:`Codec.quantize_rows`, also when the rows were cut into ranges for several threads."""

    def __init__(self, qtype: GGMLType, row: int, reason: str) -> None:
        self.qtype, self.row, self.reason = qtype, row, reason
        super().__init__(f"{qtype.type_name}: row {row} {reason}")

    def shifted(self, r0: int) -> QuantRowError:
        """The same error for rows that started at ``r0`` of the caller's rows."""
        return QuantRowError(self.qtype, self.row + r0, self.reason)


class Codec:
    """Base class: subclasses set ``qtype`` and implement the two row functions."""

    qtype: GGMLType
    #: type the activations are converted to before a dot product (ggml's ``vec_dot_type``)
    vec_dot_type: GGMLType = GGMLType.F32
    #: numpy structured dtype of one block (its itemsize is checked against ggml's type_size)
    block_dtype: np.dtype | None = None
    #: ggml_quantize_requires_imatrix
    requires_imatrix: bool = False
    #: whether this type can be quantized (ggml_quantize_chunk has no q8_K case; pyggml offers
    #: quantize_row_q8_K_ref for it, the activation format of the K-quant dot products)
    can_quantize: bool = True

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        """x: float32 (n_rows, n_per_row), C-contiguous; returns uint8 (n_rows, row_bytes)."""
        raise NotImplementedError

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        """q: uint8 (n_rows, row_bytes), C-contiguous; returns float32 (n_rows, n_per_row)."""
        raise NotImplementedError


#: below this many 256-value units a hand-off to other threads costs more than it saves (and on a busy
#: machine a waiting thread can turn microseconds into milliseconds), so the rows stay on one thread
SERIAL_BELOW_QUANT = 8


class BlockCodec(Codec):
    """The row glue every block type shares, written once: rows of floats <-> rows of blocks.

    ``quantize_rows`` allocates the zeroed output rows and hands them, as blocks
    ``(n_rows, n_blocks, type_size)``, to ``_quantize_blocks``; ``dequantize_rows`` views the
    bytes as blocks and fills float rows ``(n_rows, n_blocks * blck_size)`` with
    ``_dequantize_blocks``. Both skip empty input; big quantizations run ranges of rows on several
    threads (chunks.for_row_chunks; the bytes do not depend on the cut).
    """

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n_per_row = x.shape
        ty = self.qtype
        out = np.zeros((n_rows, n_per_row // ty.blck_size * ty.type_size), np.uint8)
        if out.size:
            blocks = out.reshape(n_rows, -1, ty.type_size)

            def rows(r0: int, r1: int) -> None:
                try:
                    self._quantize_blocks(x[r0:r1], imatrix, blocks[r0:r1])
                except QuantRowError as e:
                    raise e.shifted(r0) from None

            for_row_chunks(rows, n_rows, x.size // QK_K, SERIAL_BELOW_QUANT)
        return out

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        ty = self.qtype
        n_rows, n_blocks = q.shape[0], q.shape[1] // ty.type_size
        y = np.empty((n_rows, n_blocks * ty.blck_size), np.float32)
        if y.size:
            self._dequantize_blocks(q.reshape(n_rows, n_blocks, ty.type_size), y)
        return y

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        """x: float32 (n_rows, n_per_row); write the blocks of every row into out (n_rows, n_blocks, type_size)."""
        raise NotImplementedError

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        """blocks: uint8 (n_rows, n_blocks, type_size); write float32 rows into y (n_rows, n_blocks * blck_size)."""
        raise NotImplementedError


CODECS: dict[GGMLType, Codec] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator: instantiate and register a codec, checking its block layout size."""
    codec = cls()
    if codec.block_dtype is not None and codec.block_dtype.itemsize != codec.qtype.type_size:
        raise AssertionError(
            f"{codec.qtype.type_name}: block dtype is {codec.block_dtype.itemsize} bytes, "
            f"ggml's is {codec.qtype.type_size}"
        )
    CODECS[codec.qtype] = codec
    return cls


def declare(base: type[Codec], qtype: GGMLType, doc: str, **attrs: object) -> type[Codec]:
    """Register the codec of a type that differs from its siblings only in data (``attrs``, e.g. the
    block layout and which numba kernel to call): a subclass of ``base`` named after the type, made and
    registered in one line instead of a class body that would repeat the same five assignments."""
    namespace = {"qtype": qtype, "__doc__": doc, "__module__": base.__module__, "__qualname__": qtype.name, **attrs}
    return register(type(qtype.name, (base,), namespace))


def get_codec(qtype: GGMLType | int) -> Codec:
    try:
        ty = GGMLType(int(qtype))
    except ValueError:
        raise QuantError(f"unknown ggml type id {qtype}") from None
    codec = CODECS.get(ty)
    if codec is None:
        raise QuantError(f"no codec for type {ty.type_name}")
    return codec


def n_per_row_of(qtype: GGMLType, row_bytes: int) -> int:
    """Elements in a row of ``row_bytes`` bytes of type ``qtype``."""
    if row_bytes % qtype.type_size:
        raise QuantError(f"{row_bytes} bytes is not a whole number of {qtype.type_name} blocks")
    return row_bytes // qtype.type_size * qtype.blck_size


__all__ = [
    "CODECS",
    "SERIAL_BELOW_QUANT",
    "BlockCodec",
    "Codec",
    "QuantError",
    "QuantRowError",
    "declare",
    "get_codec",
    "n_per_row_of",
    "register",
    "row_size",
]
