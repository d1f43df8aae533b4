"""GGMLType ids, names and traits against ggml's table (and the gguf package's independent copy)."""

import gguf
import pytest

from pyggml.types import GGML_TYPE_COUNT, GGMLType, GGMLTypeError, as_type, row_size, type_from_name

LIVE = [t for t in GGMLType if not t.is_removed]
# gguf-py 0.19 lacks Q2_0, and still lists Q8_1 as 40 bytes (two float32 scales); ggml's block_q8_1
# has two fp16 scales and static_asserts 36 bytes (ggml-common.h), which is what pyggml uses.
GGUF_COMPARABLE = [t for t in LIVE if t.name in gguf.GGMLQuantizationType.__members__ and t != GGMLType.Q8_1]


def test_count_and_removed_ids():
    assert len(GGMLType) == GGML_TYPE_COUNT == 43
    removed = {t.value for t in GGMLType if t.is_removed}
    assert removed == {4, 5, 31, 32, 33, 36, 37, 38}


@pytest.mark.parametrize("ty", GGUF_COMPARABLE, ids=lambda t: t.type_name)
def test_traits_match_gguf_package(ty):
    # gguf-py keeps its own table of (block size, type size) keyed by the same ids
    qt = gguf.GGMLQuantizationType(int(ty))
    assert qt.name == ty.name
    assert gguf.GGML_QUANT_SIZES[qt] == (ty.blck_size, ty.type_size)


def test_q8_1_is_36_bytes():
    assert (GGMLType.Q8_1.blck_size, GGMLType.Q8_1.type_size) == (32, 36)


def test_names_and_row_size():
    assert GGMLType.Q4_K.type_name == "q4_K"
    assert type_from_name("q4_k") is GGMLType.Q4_K
    assert row_size(GGMLType.Q4_K, 512) == 288
    assert row_size(GGMLType.F16, 7) == 14
    with pytest.raises(GGMLTypeError, match="block size"):
        row_size(GGMLType.Q8_0, 33)


def test_removed_and_unknown_types_are_rejected():
    with pytest.raises(GGMLTypeError, match="not usable"):
        as_type(31)
    with pytest.raises(GGMLTypeError, match="unknown ggml type id"):
        as_type(99)
    with pytest.raises(GGMLTypeError, match="unknown ggml type name"):
        type_from_name("q9_9")
