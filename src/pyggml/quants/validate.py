"""``ggml_validate_row_data``: does a tensor's raw data hold only finite scales?

ggml runs this on every tensor it loads with ``check_tensors`` on. It does not decode
anything: for each type it reads the block fields that hold floats (fp16 ``d``/``m``/``dmin``,
q8_K's float32 ``d``, mxfp4's E8M0 exponent, iq1_m's scattered fp16 scale) and rejects inf and
NaN. So this module needs only each block's field offsets, and covers every type, including
the K- and I-quants whose codecs live elsewhere.

Quirks kept from ggml (ggml-quants.c, ``ggml_validate_row_data``):
* Q8_1 has no case in ggml's switch, so its data is always rejected;
* NVFP4 is always accepted (every UE4M3 byte decodes to a finite value);
* an unknown or removed type id is rejected rather than raising (ggml returns false).
"""

from __future__ import annotations

import numpy as np

from ..types import GGMLType, type_from_name
from .codec import QuantError

#: types whose blocks carry fp16 scales, with the byte offsets of those scales
_FP16_FIELDS: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q5_0: (0,),
    GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,),
    GGMLType.Q1_0: (0,),
    GGMLType.Q2_0: (0,),
    GGMLType.Q2_K: (80, 82),  # d, dmin after scales[16] and qs[64]
    GGMLType.Q3_K: (108,),  # d after hmask[32], qs[64], scales[12]
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),  # d after ql[128], qh[64], scales[16]
    GGMLType.TQ1_0: (52,),  # d after qs[48], qh[4]
    GGMLType.TQ2_0: (64,),  # d after qs[64]
    GGMLType.IQ1_S: (0,),
    GGMLType.IQ2_XXS: (0,),
    GGMLType.IQ2_XS: (0,),
    GGMLType.IQ2_S: (0,),
    GGMLType.IQ3_XXS: (0,),
    GGMLType.IQ3_S: (0,),
    GGMLType.IQ4_NL: (0,),
    GGMLType.IQ4_XS: (0,),
}

#: types with nothing to check
_ALWAYS_OK = frozenset({GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64, GGMLType.NVFP4})

_IQ1M_SCALES = 48  # iq1_m: qs[32], qh[16], then scales[8] read as four u16


def _as_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if isinstance(data, bytes | bytearray | memoryview):
        return np.frombuffer(data, dtype=np.uint8)
    raise QuantError(f"validate_row_data expects bytes or a numpy array, got {type(data).__name__}")


def _u16(blocks: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<u2")[:, 0]


def _fp16_finite(h: np.ndarray) -> bool:
    return bool(np.all((h & 0x7C00) != 0x7C00))


def _iq1m_scale(blocks: np.ndarray) -> np.ndarray:
    """The fp16 super-block scale of iq1_m: the top nibble of each of its four u16 scale words."""
    sc = [_u16(blocks, _IQ1M_SCALES + 2 * k) for k in range(4)]
    return (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)


def validate_row_data(qtype: GGMLType | int | str, data: bytes | bytearray | memoryview | np.ndarray) -> bool:
    """True when ``data`` is a whole number of ``qtype`` blocks and none of their scales is inf/NaN.

    Like ggml, an unknown or removed type id just gives False; an unknown type *name* raises,
    since no ggml caller could pass one.
    """
    buf = _as_bytes(data)
    if isinstance(qtype, str):
        ty = type_from_name(qtype)
    else:
        try:
            ty = GGMLType(int(qtype))
        except ValueError:
            return False
    if ty.is_removed:
        return False
    if buf.size % ty.type_size:
        return False
    if ty in _ALWAYS_OK:
        return True
    blocks = buf.reshape(-1, ty.type_size)
    if ty in _FP16_FIELDS:
        return all(_fp16_finite(_u16(blocks, off)) for off in _FP16_FIELDS[ty])
    if ty == GGMLType.F16:
        return _fp16_finite(buf.view("<u2"))
    if ty == GGMLType.BF16:
        return bool(np.all((buf.view("<u2") & 0x7F80) != 0x7F80))
    if ty == GGMLType.F32:
        return bool(np.all(np.isfinite(buf.view("<f4"))))
    if ty == GGMLType.F64:
        return bool(np.all(np.isfinite(buf.view("<f8"))))
    if ty == GGMLType.Q8_K:
        return bool(np.all(np.isfinite(np.ascontiguousarray(blocks[:, :4]).view("<f4"))))
    if ty == GGMLType.MXFP4:
        return bool(np.all(blocks[:, 0] != 0xFF))
    if ty == GGMLType.IQ1_M:
        return _fp16_finite(_iq1m_scale(blocks))
    return False  # Q8_1: not in ggml's switch


__all__ = ["validate_row_data"]
