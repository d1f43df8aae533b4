"""``pyggml imatrix`` and the imatrix collector: exact sums on a small model, llama-imatrix's file on Gemma,
GGUF and legacy .dat files, combining, statistics, and quantizing with a collected imatrix."""

from __future__ import annotations

import os
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from pyggml.cli.main import main
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model
from pyggml.quantize import (
    IMatrix,
    IMatrixCollector,
    IMatrixEntry,
    QuantizeError,
    QuantizeOptions,
    load_imatrix,
    quantize_model,
    save_imatrix,
)
from quantize_models import make_model, make_tokenized_model

DATA = Path(__file__).parent / "data" / "quantize"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("llama2f16", tmp_path_factory.mktemp("im"))


def _seq_sumsq(x: np.ndarray) -> np.ndarray:
    acc = np.zeros(x.shape[1], dtype=np.float32)
    for row in x:
        acc += row * row
    return acc


def test_collector_sums_the_squared_inputs_of_each_weight(small: Path) -> None:
    """Sums equal the float32 row-by-row sums of the captured matmul inputs; counts are the rows."""
    ctx = LlamaContext(Model(small, progress=False), ContextParams(n_ctx=64, n_ubatch=64, n_threads=1))
    col = IMatrixCollector(chunk_size=32)
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 128, 32).tolist() for _ in range(2)]
    seen: dict[str, list[np.ndarray]] = {"attn_norm-0": [], "attn_norm-1": [], "ffn_norm-1": []}
    for toks in chunks:
        ctx.clear()
        with col.attach(ctx):
            ctx.decode(toks[:8], outputs=[True] * 8)  # < 16 rows: ignored, as llama-imatrix ignores them
        ctx.clear()
        with col.attach(ctx):
            ctx.decode(toks, outputs=[True] * 32)
        ctx.clear()
        with ctx.capture(r"attn_norm-[01]|ffn_norm-1") as cap:
            ctx.decode(toks, outputs=[True] * 32)
        for k in seen:
            seen[k].append(cap[k].reshape(-1, cap[k].shape[-1]))
    im = col.result(["t.txt"])
    assert im.chunk_count == 2 and im.chunk_size == 32 and im.datasets == ["t.txt"]
    assert sorted(im.entries) == sorted(f"blk.{i}.{w}.weight" for i in range(2) for w in
                                        ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"))
    for k, weights in (("attn_norm-0", ["blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v"]),
                       ("attn_norm-1", ["blk.1.attn_q"]), ("ffn_norm-1", ["blk.1.ffn_gate", "blk.1.ffn_up"])):
        want = _seq_sumsq(np.concatenate(seen[k]))
        for w in weights:
            e = im.entries[w + ".weight"]
            assert e.counts.tolist() == [64]
            np.testing.assert_array_equal(e.sums, want)
    assert "output.weight" not in im.entries
    col2 = IMatrixCollector(chunk_size=32, process_output=True)
    with col2.attach(ctx):  # tied embeddings: the output matmul uses token_embd.weight, never collected
        ctx.clear()
        ctx.decode(chunks[0], outputs=[True] * 32)
    assert "output.weight" not in col2.result().entries and "token_embd.weight" not in col2.result().entries


def test_process_output_collects_an_untied_output(tmp_path: Path) -> None:
    ctx = LlamaContext(Model(make_model("llama8", tmp_path), progress=False),
                       ContextParams(n_ctx=64, n_ubatch=64, n_threads=1))
    for process_output in (False, True):
        col = IMatrixCollector(chunk_size=16, process_output=process_output)
        with col.attach(ctx):
            ctx.clear()
            ctx.decode(list(range(16)), outputs=[True] * 16)
        with ctx.capture("result_norm") as cap:  # one callback at a time: capture in a second decode
            ctx.clear()
            ctx.decode(list(range(16)), outputs=[True] * 16)
        entries = col.result().entries
        assert ("output.weight" in entries) == process_output
        if process_output:
            assert entries["output.weight"].counts.tolist() == [16]
            np.testing.assert_array_equal(entries["output.weight"].sums,
                                          _seq_sumsq(cap["result_norm"].reshape(16, -1)))


def test_gguf_roundtrip_combine_and_legacy(tmp_path: Path) -> None:
    a = IMatrix(entries={"blk.0.x.weight": IMatrixEntry(np.arange(1, 9, dtype=np.float32), np.array([4]))},
                datasets=["a.txt"], chunk_count=2, chunk_size=2, has_metadata=True)
    b = IMatrix(entries={"blk.0.x.weight": IMatrixEntry(np.full(8, 2, np.float32), np.array([2]))},
                datasets=["b.txt"], chunk_count=1, chunk_size=2, has_metadata=True)
    save_imatrix(a, tmp_path / "a.gguf")
    save_imatrix(b, tmp_path / "b.gguf")
    ra = load_imatrix(tmp_path / "a.gguf")
    assert ra.datasets == ["a.txt"] and ra.chunk_count == 2 and ra.chunk_size == 2 and not ra.is_legacy
    np.testing.assert_array_equal(ra.for_quantize()["blk.0.x.weight"], np.arange(1, 9, dtype=np.float32) / 4)
    assert main(["imatrix", "-q", "-c", "2", "--in-file", str(tmp_path / "a.gguf"), "--in-file",
                 str(tmp_path / "b.gguf"), "-o", str(tmp_path / "ab.gguf")]) == 0
    ab = load_imatrix(tmp_path / "ab.gguf")
    assert ab.datasets == ["a.txt", "b.txt"] and ab.chunk_count == 3
    np.testing.assert_array_equal(ab.entries["blk.0.x.weight"].sums, np.arange(1, 9, dtype=np.float32) + 2)
    assert ab.entries["blk.0.x.weight"].counts.tolist() == [6]
    # legacy .dat (llama-imatrix --output-format dat): n, then name, ncall, nval, (sum/count)*ncall; chunks, dataset
    vals = np.array([0.5, 1.5, 2.5, 3.5], np.float32)
    name = b"blk.1.y.weight"
    raw = struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 3, 4) + (vals * 3).tobytes()
    raw += struct.pack("<ii", 7, 5) + b"d.txt"
    (tmp_path / "old.dat").write_bytes(raw)
    old = load_imatrix(tmp_path / "old.dat")
    assert old.is_legacy and old.chunk_count == 7 and old.datasets == ["d.txt"]
    np.testing.assert_allclose(old.for_quantize()["blk.1.y.weight"], vals, rtol=1e-7)
    assert main(["imatrix", "-q", "-c", "10", "--in-file", str(tmp_path / "old.dat"), "-o",
                 str(tmp_path / "new.gguf")]) == 0
    new = load_imatrix(tmp_path / "new.gguf")  # legacy averages scaled back by the chunk size
    np.testing.assert_allclose(new.entries["blk.1.y.weight"].sums, vals * 3 * 10, rtol=1e-6)
    assert new.entries["blk.1.y.weight"].counts.tolist() == [30] and new.chunk_count == 3


def test_bad_imatrix_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.dat").write_bytes(b"\x01\x00")
    with pytest.raises(QuantizeError, match="neither GGUF nor a complete legacy"):
        load_imatrix(tmp_path / "junk.dat")
    with pytest.raises(QuantizeError, match="no such file"):
        load_imatrix(tmp_path / "none.gguf")
    assert main(["imatrix", "-q", "-o", str(tmp_path / "x.gguf")]) == 1
    assert "no text" in capsys.readouterr().err
    assert main(["imatrix", "--show-statistics"]) == 1
    assert "exactly one --in-file" in capsys.readouterr().err


def test_statistics_rows_match_llama_imatrix(capsys: pytest.CaptureFixture[str]) -> None:
    """The per-tensor and per-layer rows of --show-statistics, character for character with llama-imatrix's."""
    assert main(["imatrix", "--show-statistics", "--in-file", str(DATA / "tok2-imatrix-c32-chunks3.gguf")]) == 0
    ours = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    ref = (DATA / "tok2-statistics.txt").read_text().splitlines()
    assert len(ref) == 16
    rows = [line for line in ours if line.lstrip()[:1].isdigit()]
    assert rows == ref


def test_show_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["imatrix", "--show-statistics", "--in-file", str(DATA / "gemma-imatrix-c128-chunks4.gguf")]) == 0
    out = capsys.readouterr().out
    assert "Computing statistics (126 tensors)" in out and "weighted average statistics per layer (18 layers)" in out


def _gemma() -> Path:
    try:
        from pyggml.llm.models import default_model_path

        return default_model_path()
    except Exception as e:
        pytest.skip(f"the default Gemma model is not installed: {e}")


def test_gemma_imatrix_matches_llama_imatrix(tmp_path: Path) -> None:
    """Same entries, counts and metadata as llama-imatrix; the sums of layer 0's attention inputs (the
    embeddings' norm, computed bit for bit) are equal, the deeper ones differ only by the forward pass's
    float round-off, which is smaller than llama.cpp's own flash-attention on/off difference (~1e-2 worst)."""
    gemma = _gemma()
    out = tmp_path / "im.gguf"
    cwd = os.getcwd()
    os.chdir(DATA)  # imatrix.datasets records the text's path as given
    try:
        assert main(["imatrix", "-q", "-m", str(gemma), "-f", "imatrix-text.txt", "-o", str(out), "-c", "128",
                     "--chunks", "4"]) == 0
    finally:
        os.chdir(cwd)
    ours, ref = load_imatrix(out), load_imatrix(DATA / "gemma-imatrix-c128-chunks4.gguf")
    assert list(ours.entries) == list(ref.entries) and len(ref.entries) == 126
    assert (ours.datasets, ours.chunk_count, ours.chunk_size) == (ref.datasets, ref.chunk_count, ref.chunk_size)
    for k, e in ref.entries.items():
        mine = ours.entries[k]
        assert mine.counts.tolist() == e.counts.tolist() == [512]
        if k.startswith("blk.0.attn_") and k != "blk.0.attn_output.weight":
            np.testing.assert_array_equal(mine.sums, e.sums)
        np.testing.assert_allclose(mine.sums.sum(), e.sums.sum(), rtol=5e-3, err_msg=k)
        np.testing.assert_allclose(mine.sums, e.sums, rtol=0.25, atol=1e-3, err_msg=k)


TOK2_SHA256 = "67f439c4be2c0413fcf63968f69790ceced9384dce0d178ce4364402a4ab52b2"


def test_imatrix_cli_matches_llama_imatrix_on_a_small_model(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # llama-imatrix printed "[1]373.9384,[2]365.3591,[3]341.4015," and "Final estimate: PPL = 341.4015 +/- 22.07676"
    """`pyggml imatrix` on a 2-layer model with a BPE tokenizer (BOS first in every chunk) against llama-imatrix:
    same entries, counts, chunk count/size and datasets; layer 0's q/k/v sums (inputs computed bit for bit)
    equal; the rest within the forward pass's float32 round-off (measured worst 1.6e-4 relative)."""
    import hashlib

    model = make_tokenized_model(tmp_path / "tok2.gguf")
    assert hashlib.sha256(model.read_bytes()).hexdigest() == TOK2_SHA256, "the tokenized test model changed"
    out = tmp_path / "im.gguf"
    cwd = os.getcwd()
    os.chdir(DATA)  # imatrix.datasets records the text's path as given
    try:
        assert main(["imatrix", "-q", "-m", str(model), "-f", "imatrix-text.txt", "-o", str(out), "-c", "32",
                     "--chunks", "3", "-t", "1"]) == 0
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    ppl = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", printed)]
    np.testing.assert_allclose(ppl, [373.9384, 365.3591, 341.4015], rtol=1e-4)
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", printed)
    assert final is not None
    np.testing.assert_allclose([float(final[1]), float(final[2])], [341.4015, 22.07676], rtol=1e-4)
    ours, ref = load_imatrix(out), load_imatrix(DATA / "tok2-imatrix-c32-chunks3.gguf")
    assert list(ours.entries) == list(ref.entries) and len(ref.entries) == 14
    assert (ours.datasets, ours.chunk_count, ours.chunk_size) == (["imatrix-text.txt"], 3, 32)
    assert (ref.datasets, ref.chunk_count, ref.chunk_size) == (["imatrix-text.txt"], 3, 32)
    for k, e in ref.entries.items():
        assert ours.entries[k].counts.tolist() == e.counts.tolist() == [96]
        if k in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
            np.testing.assert_array_equal(ours.entries[k].sums, e.sums)
        np.testing.assert_allclose(ours.entries[k].sums, e.sums, rtol=1e-3, err_msg=k)
    # the legacy format (--output-format dat): same entries, call counts, chunks and dataset as llama-imatrix's
    cwd = os.getcwd()
    os.chdir(DATA)
    try:
        assert main(["imatrix", "-q", "-m", str(model), "-f", "imatrix-text.txt", "-o", str(tmp_path / "im.dat"),
                     "--output-format", "dat", "-c", "32", "--chunks", "3", "-t", "1"]) == 0
    finally:
        os.chdir(cwd)
    ours, ref = load_imatrix(tmp_path / "im.dat"), load_imatrix(DATA / "tok2-imatrix-c32-chunks3.dat")
    assert ours.is_legacy and ref.is_legacy and list(ours.entries) == list(ref.entries)
    assert (ours.datasets, ours.chunk_count) == (ref.datasets, ref.chunk_count) == (["imatrix-text.txt"], 3)
    assert (tmp_path / "im.dat").stat().st_size == (DATA / "tok2-imatrix-c32-chunks3.dat").stat().st_size
    for k, e in ref.entries.items():
        assert ours.entries[k].counts.tolist() == e.counts.tolist() == [3]
        np.testing.assert_allclose(ours.entries[k].sums, e.sums, rtol=1e-3, err_msg=k)
    # llama-imatrix needs two chunks of text; a missing text file is one error line
    for argv, needle in ((["-f", str(DATA / "imatrix-text.txt"), "-c", "2048"], "you need at least 4096 tokens"),
                         (["-f", str(tmp_path / "none.txt")], "file not found")):
        out.unlink(missing_ok=True)
        assert main(["imatrix", "-q", "-m", str(model), "-o", str(out), *argv]) == 1
        assert not out.exists()
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err


def test_quantize_with_a_collected_imatrix(small: Path, tmp_path: Path) -> None:
    """An imatrix from the collector drives IQ2_XXS (which refuses without one) and records its keys."""
    ctx = LlamaContext(Model(small, progress=False), ContextParams(n_ctx=64, n_ubatch=64, n_threads=1))
    col = IMatrixCollector(chunk_size=32)
    with col.attach(ctx):
        ctx.decode(list(range(32)), outputs=[True] * 32)
    im_path = save_imatrix(col.result(["calib.txt"]), tmp_path / "c.gguf")
    with pytest.raises(QuantizeError, match="requires an importance matrix"):
        quantize_model(small, tmp_path / "no.gguf", "IQ2_XXS", QuantizeOptions(progress=False))
    assert not (tmp_path / "no.gguf").exists()
    res = quantize_model(small, tmp_path / "q.gguf", "IQ2_XXS", QuantizeOptions(imatrix=im_path, progress=False))
    from pyggml.gguf import GGUFReader

    with GGUFReader(res.path) as r:
        assert r["quantize.imatrix.dataset"] == "calib.txt" and r["quantize.imatrix.entries_count"] == 14
        assert r["quantize.imatrix.chunks_count"] == 1 and r["general.file_type"] == 19
