"""GGUF tensors into pyggml Tensors, as ggml's gguf_init_from_file with params.ctx does it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.context import Context, tensor_overhead
from pyggml.gguf import GGUFError, GGUFReader, GGUFWriter
from pyggml.gguf_loader import BLOB_NAME, init_context, load_tensor
from pyggml.types import GGMLType


@pytest.fixture
def reader(tmp_path: Path) -> GGUFReader:
    rng = np.random.default_rng(1)
    w = GGUFWriter()
    w.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("h", rng.standard_normal(7).astype(np.float16))
    w.add_tensor("q", rng.integers(0, 256, (2, 68), dtype=np.uint8), type=GGMLType.Q8_0)
    return GGUFReader(w.write(tmp_path / "l.gguf"))


def test_init_context_copies_the_blob(reader: GGUFReader) -> None:
    ctx = init_context(reader)
    names = [t.name for t in ctx.tensors()]
    assert names == [BLOB_NAME, "a", "h", "q"]
    assert ctx.get_mem_size() >= 4 * tensor_overhead() + reader.data_size
    for ti in reader.tensors:
        t = ctx.get_tensor(ti.name)
        assert t.type == ti.type and tuple(t.ne) == ti.ne
        assert np.array_equal(t.numpy().reshape(-1).view(np.uint8), reader.tensor_bytes(ti.name))
    blob = ctx.get_tensor(BLOB_NAME)
    assert ctx.get_tensor("q").data == blob.data + reader.tensor_info("q").offset


def test_init_context_no_alloc_has_shapes_only(reader: GGUFReader) -> None:
    ctx = init_context(reader, no_alloc=True)
    assert [t.name for t in ctx.tensors()] == ["a", "h", "q"]
    assert all(t.data is None for t in ctx.tensors())


def test_load_tensor(reader: GGUFReader) -> None:
    ctx = Context(16 * 1024)
    t = load_tensor(ctx, reader, "a")
    assert t.name == "a" and np.array_equal(t.numpy(), reader.tensor_data("a"))
    with pytest.raises(GGUFError, match="no_alloc"):
        load_tensor(Context(16 * 1024, no_alloc=True), reader, "a")
