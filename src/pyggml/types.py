"""ggml's tensor types (``enum ggml_type``) and their traits table.

The ids, names, block sizes and type sizes are ggml's (ggml.h:389-434, ggml.c:631-945).
Removed ids keep their slot with block size 0, exactly as ggml's traits do, so a file
that names one is recognised and rejected with ggml's own message.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .errors import PyGGMLError

QK_K = 256
K_SCALE_SIZE = 12


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q4_2 = 4  # removed
    Q4_3 = 5  # removed
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    Q4_0_4_4 = 31  # removed
    Q4_0_4_8 = 32  # removed
    Q4_0_8_8 = 33  # removed
    TQ1_0 = 34
    TQ2_0 = 35
    IQ4_NL_4_4 = 36  # removed
    IQ4_NL_4_8 = 37  # removed
    IQ4_NL_8_8 = 38  # removed
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42

    # Every member's traits, set on it once from TYPE_TRAITS below (annotations alone make no members):
    traits: TypeTraits
    type_name: str  #: ggml's ``ggml_type_name`` (e.g. ``q4_K``)
    blck_size: int
    type_size: int
    is_quantized: bool
    is_removed: bool  #: the id is gone from ggml; it keeps its slot with block size 0

    def row_size(self, ne: int) -> int:
        """ggml_row_size: bytes of ``ne`` elements (``ne`` must be a multiple of the block)."""
        return row_size(self, ne)


GGML_TYPE_COUNT = 43


@dataclass(frozen=True)
class TypeTraits:
    name: str
    blck_size: int
    type_size: int
    is_quantized: bool
    # numpy dtype of one element for the plain (block size 1) types, else None
    np_dtype: np.dtype | None = None


def _t(name: str, blck: int, size: int, quant: bool, dt: str | None = None) -> TypeTraits:
    return TypeTraits(name, blck, size, quant, np.dtype(dt) if dt else None)


_REMOVED_Q4_0 = "TYPE_{} REMOVED, use Q4_0 with runtime repacking"
_REMOVED_IQ4_NL = "TYPE_{} REMOVED, use IQ4_NL with runtime repacking"

TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: _t("f32", 1, 4, False, "<f4"),
    GGMLType.F16: _t("f16", 1, 2, False, "<f2"),
    GGMLType.Q4_0: _t("q4_0", 32, 18, True),
    GGMLType.Q4_1: _t("q4_1", 32, 20, True),
    GGMLType.Q4_2: _t("DEPRECATED", 0, 0, False),
    GGMLType.Q4_3: _t("DEPRECATED", 0, 0, False),
    GGMLType.Q5_0: _t("q5_0", 32, 22, True),
    GGMLType.Q5_1: _t("q5_1", 32, 24, True),
    GGMLType.Q8_0: _t("q8_0", 32, 34, True),
    GGMLType.Q8_1: _t("q8_1", 32, 36, True),
    GGMLType.Q2_K: _t("q2_K", QK_K, 84, True),
    GGMLType.Q3_K: _t("q3_K", QK_K, 110, True),
    GGMLType.Q4_K: _t("q4_K", QK_K, 144, True),
    GGMLType.Q5_K: _t("q5_K", QK_K, 176, True),
    GGMLType.Q6_K: _t("q6_K", QK_K, 210, True),
    GGMLType.Q8_K: _t("q8_K", QK_K, 292, True),
    GGMLType.IQ2_XXS: _t("iq2_xxs", QK_K, 66, True),
    GGMLType.IQ2_XS: _t("iq2_xs", QK_K, 74, True),
    GGMLType.IQ3_XXS: _t("iq3_xxs", QK_K, 98, True),
    GGMLType.IQ1_S: _t("iq1_s", QK_K, 50, True),
    GGMLType.IQ4_NL: _t("iq4_nl", 32, 18, True),
    GGMLType.IQ3_S: _t("iq3_s", QK_K, 110, True),
    GGMLType.IQ2_S: _t("iq2_s", QK_K, 82, True),
    GGMLType.IQ4_XS: _t("iq4_xs", QK_K, 136, True),
    GGMLType.I8: _t("i8", 1, 1, False, "i1"),
    GGMLType.I16: _t("i16", 1, 2, False, "<i2"),
    GGMLType.I32: _t("i32", 1, 4, False, "<i4"),
    GGMLType.I64: _t("i64", 1, 8, False, "<i8"),
    GGMLType.F64: _t("f64", 1, 8, False, "<f8"),
    GGMLType.IQ1_M: _t("iq1_m", QK_K, 56, True),
    GGMLType.BF16: _t("bf16", 1, 2, False),  # numpy has no bfloat16: stored as uint16 bits
    GGMLType.Q4_0_4_4: _t(_REMOVED_Q4_0.format("Q4_0_4_4"), 0, 0, False),
    GGMLType.Q4_0_4_8: _t(_REMOVED_Q4_0.format("Q4_0_4_8"), 0, 0, False),
    GGMLType.Q4_0_8_8: _t(_REMOVED_Q4_0.format("Q4_0_8_8"), 0, 0, False),
    GGMLType.TQ1_0: _t("tq1_0", QK_K, 54, True),
    GGMLType.TQ2_0: _t("tq2_0", QK_K, 66, True),
    GGMLType.IQ4_NL_4_4: _t(_REMOVED_IQ4_NL.format("IQ4_NL_4_4"), 0, 0, False),
    GGMLType.IQ4_NL_4_8: _t(_REMOVED_IQ4_NL.format("IQ4_NL_4_8"), 0, 0, False),
    GGMLType.IQ4_NL_8_8: _t(_REMOVED_IQ4_NL.format("IQ4_NL_8_8"), 0, 0, False),
    GGMLType.MXFP4: _t("mxfp4", 32, 17, True),
    GGMLType.NVFP4: _t("nvfp4", 64, 36, True),
    GGMLType.Q1_0: _t("q1_0", 128, 18, True),
    GGMLType.Q2_0: _t("q2_0", 64, 18, True),
}

assert len(TYPE_TRAITS) == GGML_TYPE_COUNT == len(GGMLType)
for _ty, _tr in TYPE_TRAITS.items():
    _ty.traits, _ty.type_name, _ty.blck_size, _ty.type_size = _tr, _tr.name, _tr.blck_size, _tr.type_size
    _ty.is_quantized, _ty.is_removed = _tr.is_quantized, _tr.blck_size == 0
del _ty, _tr

_BY_NAME = {t.name: ty for ty, t in TYPE_TRAITS.items() if t.blck_size}


class GGMLTypeError(PyGGMLError, ValueError):
    """An unknown, removed or unsupported tensor type."""


def type_from_name(name: str) -> GGMLType:
    """The type whose ggml name is ``name`` (case-insensitive: ``Q4_K`` and ``q4_K`` both work)."""
    ty = _BY_NAME.get(name)
    if ty is None:
        for n, t in _BY_NAME.items():
            if n.lower() == name.lower():
                return t
        raise GGMLTypeError(f"unknown ggml type name {name!r}")
    return ty


def as_type(t: GGMLType | int | str) -> GGMLType:
    """Coerce an id, name or GGMLType to a live GGMLType, rejecting removed ids."""
    if isinstance(t, str):
        return type_from_name(t)
    try:
        ty = GGMLType(int(t))
    except ValueError:
        raise GGMLTypeError(f"unknown ggml type id {t}") from None
    if ty.is_removed:
        raise GGMLTypeError(f"type {int(ty)} ({ty.type_name}) is not usable")
    return ty


def type_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].type_size


def blck_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].blck_size


def is_quantized(t: GGMLType) -> bool:
    return TYPE_TRAITS[t].is_quantized


def row_size(t: GGMLType, ne: int) -> int:
    """ggml_row_size: ``type_size * ne / blck_size``; ``ne`` must be a whole number of blocks."""
    tr = TYPE_TRAITS[t]
    if tr.blck_size == 0:
        raise GGMLTypeError(f"type {int(t)} ({tr.name}) is not usable")
    if ne % tr.blck_size:
        raise GGMLTypeError(f"{ne} elements is not a multiple of the {tr.name} block size {tr.blck_size}")
    return tr.type_size * (ne // tr.blck_size)
