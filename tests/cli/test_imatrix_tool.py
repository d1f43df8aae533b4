"""``pyggml imatrix`` and the imatrix collector: exact sums on a small model, llama-imatrix's file on Gemma,
GGUF and legacy .dat files, combining, statistics, and quantizing with a collected imatrix."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from helpers.data import data_path
from helpers.quantize_models import make_model, make_tokenized_model
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

DATA = data_path("quantize")


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


def test_a_reused_graph_keeps_the_plans_of_its_callback_pieces(small: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector cuts the graph at every matmul; a reused graph is cut at the same nodes, so the CPU
    backend's plans of the pieces are kept: a second decode of the same shape plans nothing, and sums the same."""
    from pyggml.backend.cpu import plan

    built = []
    init = plan.GraphPlan.__init__
    monkeypatch.setattr(plan.GraphPlan, "__init__", lambda self, *a, **k: (built.append(1), init(self, *a, **k))[1])
    ctx = LlamaContext(Model(small, progress=False), ContextParams(n_ctx=64, n_ubatch=64, n_threads=1))
    toks = np.random.default_rng(1).integers(0, 128, 32).tolist()
    sums = []
    for _ in range(2):
        col = IMatrixCollector(chunk_size=32)
        ctx.clear()
        with col.attach(ctx):
            ctx.decode(toks, outputs=[True] * 32)
        sums.append(col.result().entries["blk.1.ffn_down.weight"].sums)
        built.append(None)  # a marker between the two decodes
    first, second = built[: built.index(None)], built[built.index(None) + 1 : -1]
    # 14 collected products read 8 distinct inputs (4 a layer: attn_q/k/v share one, ffn_gate/up one): the graph
    # is cut after the first reader of each, 9 pieces; the others are collected when asked
    assert ctx.n_reused >= 1 and len(first) == 9
    assert second == []
    np.testing.assert_array_equal(sums[1], sums[0])


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


@pytest.mark.slow
def test_gemma_imatrix_matches_llama_imatrix(tmp_path: Path, gemma_path: Path) -> None:
    """Same entries, counts and metadata as llama-imatrix; the sums of layer 0's attention inputs are equal
    (its Q5_0/Q8_0 products, RoPE, softmax and F16 attention take llama.cpp's x86 float steps), the deeper
    ones differ by the forward pass's float round-off (the K-quant products sum in another order), which is
    smaller than llama.cpp's own flash-attention on/off difference (~1e-2 worst)."""
    out = tmp_path / "im.gguf"
    cwd = os.getcwd()
    os.chdir(DATA)  # imatrix.datasets records the text's path as given
    try:
        assert main(["imatrix", "-q", "-m", str(gemma_path), "-f", "imatrix-text.txt", "-o", str(out), "-c", "128",
                     "--chunks", "4", "-fa", "off"]) == 0
    finally:
        os.chdir(cwd)
    ours, ref = load_imatrix(out), load_imatrix(DATA / "gemma-imatrix-c128-chunks4.gguf")
    assert list(ours.entries) == list(ref.entries) and len(ref.entries) == 126
    assert (ours.datasets, ours.chunk_count, ours.chunk_size) == (ref.datasets, ref.chunk_count, ref.chunk_size)
    for k, e in ref.entries.items():
        mine = ours.entries[k]
        assert mine.counts.tolist() == e.counts.tolist() == [512]
        if k.startswith("blk.0.attn_"):  # the whole of layer 0's attention runs llama.cpp's float steps
            np.testing.assert_array_equal(mine.sums, e.sums, err_msg=k)
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
                     "--chunks", "3", "-t", "1", "-fa", "off"]) == 0
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
                     "--output-format", "dat", "-c", "32", "--chunks", "3", "-t", "1", "-fa", "off"]) == 0
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


@pytest.mark.slow
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


# ---------------------------------------------------------------- llama-imatrix's options (-b, -ofreq, ...)
TEXT = DATA / "imatrix-text.txt"


@pytest.fixture(scope="module")
def tok2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenized_model(tmp_path_factory.mktemp("tok2") / "tok2.gguf")


def _run(model: Path, out: Path, *flags: str, text: Path = TEXT) -> None:
    assert main(["imatrix", "-q", "-m", str(model), "-f", str(text), "-o", str(out), "-c", "32", "-t", "1",
                 *flags]) == 0


def _assert_same(a: IMatrix, b: IMatrix, rtol: float = 0.0) -> None:
    assert a.chunk_count == b.chunk_count and list(a.entries) == list(b.entries) and len(a.entries) == 14
    for k, e in a.entries.items():
        assert e.counts.tolist() == b.entries[k].counts.tolist(), k
        if rtol:
            np.testing.assert_allclose(e.sums, b.entries[k].sums, rtol=rtol, err_msg=k)
        else:
            np.testing.assert_array_equal(e.sums, b.entries[k].sums, err_msg=k)


def test_batch_size_decodes_several_chunks_per_batch(tok2: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """-b 96 with -c 32 decodes 3 chunks per batch (5 chunks: 2 decodes), -b 16 each chunk in 2 batches:
    the same counts and chunk count as one chunk per batch, sums and perplexities within float32 round-off
    (measured 4.8e-5 and 1.5e-5 relative)."""
    calls: list[int] = []
    real = LlamaContext.decode_batch

    def spy(self: LlamaContext, batch: object, **kw: object) -> np.ndarray:
        calls.append(len(batch.token))  # type: ignore[attr-defined]
        return real(self, batch, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaContext, "decode_batch", spy)
    ims, ppls = {}, {}
    for b, want in (("32", [32] * 5), ("96", [96, 64]), ("16", [16] * 10)):
        calls.clear()
        _run(tok2, tmp_path / f"b{b}.gguf", "--chunks", "5", "-b", b)
        assert calls == want, (b, calls)
        ims[b] = load_imatrix(tmp_path / f"b{b}.gguf")
        ppls[b] = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", capsys.readouterr().out)]
    assert ims["32"].chunk_count == 5 and ims["32"].entries["blk.1.ffn_down.weight"].counts.tolist() == [160]
    for b in ("96", "16"):
        _assert_same(ims[b], ims["32"], rtol=2e-4)
        np.testing.assert_allclose(ppls[b], ppls["32"], rtol=1e-5)
    # llama-imatrix -c 32 -b 96 --chunks 5 printed these (its default: flash attention on, as pyggml's)
    np.testing.assert_allclose(ppls["96"], [373.9888, 365.3886, 341.4179, 322.5995, 317.9555], rtol=2e-4)


def test_save_frequency_copies_are_named_as_llama_imatrix_names_them(tok2: Path, tmp_path: Path) -> None:
    """--save-frequency 2: OUT.at_2 and OUT.at_4 (llama-imatrix's names), each equal to a run stopped there;
    with 3 chunks per batch the count goes 3, 5 and the copies are .at_3 and .at_5, as llama-imatrix's."""
    out = tmp_path / "im.gguf"
    _run(tok2, out, "--chunks", "5", "-b", "32", "--save-frequency", "2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["im.gguf", "im.gguf.at_2", "im.gguf.at_4"]
    for n in (2, 4):
        _run(tok2, tmp_path / f"stop{n}.gguf", "--chunks", str(n), "-b", "32")
        _assert_same(load_imatrix(tmp_path / f"im.gguf.at_{n}"), load_imatrix(tmp_path / f"stop{n}.gguf"))
    (tmp_path / "b96").mkdir()
    _run(tok2, tmp_path / "b96" / "im.gguf", "--chunks", "5", "-b", "96", "--save-frequency", "2")
    assert sorted(p.name for p in (tmp_path / "b96").iterdir()) == ["im.gguf", "im.gguf.at_3", "im.gguf.at_5"]
    assert load_imatrix(tmp_path / "b96" / "im.gguf.at_3").chunk_count == 3
    (tmp_path / "dat").mkdir()
    _run(tok2, tmp_path / "dat" / "im.dat", "--chunks", "3", "-b", "32", "--save-frequency", "3",
         "--output-format", "dat")
    copy = load_imatrix(tmp_path / "dat" / "im.dat.at_3")
    assert copy.is_legacy and copy.chunk_count == 3


def test_output_frequency_writes_the_output_as_a_run_stopped_there(tok2: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """-ofreq 2 over 5 chunks writes OUT after chunks 2 and 4 and at the end; each write holds every weight
    at that chunk, equal to a run stopped there. The default (10) writes only at the end of 5 chunks."""
    import pyggml.cli.imatrix as cli_imatrix

    written: list[tuple[str, IMatrix]] = []
    real = cli_imatrix.save

    def spy(args: object, col: object, path: str) -> None:
        real(args, col, path)  # type: ignore[arg-type]
        written.append((Path(path).name, load_imatrix(path)))

    monkeypatch.setattr(cli_imatrix, "save", spy)
    out = tmp_path / "im.gguf"
    _run(tok2, out, "--chunks", "5", "-b", "32", "-ofreq", "2")
    assert [(name, im.chunk_count) for name, im in written] == [("im.gguf", 2), ("im.gguf", 4), ("im.gguf", 5)]
    for name, im in written:
        assert {int(e.counts[0]) for e in im.entries.values()} == {32 * im.chunk_count}, name
    monkeypatch.setattr(cli_imatrix, "save", real)
    _run(tok2, tmp_path / "stop2.gguf", "--chunks", "2", "-b", "32")
    _assert_same(written[0][1], load_imatrix(tmp_path / "stop2.gguf"))
    monkeypatch.setattr(cli_imatrix, "save", spy)
    written.clear()
    _run(tok2, out, "--chunks", "5", "-b", "32")
    assert [(name, im.chunk_count) for name, im in written] == [("im.gguf", 5)]


def test_chunk_skips_exactly_the_first_chunks(tok2: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """--chunk 1 --chunks 2 processes chunks 1 and 2: with chunk 0 alone (combined by --in-file) it gives
    the 3-chunk imatrix, and its first perplexity is chunk 1's own, b*b/a from a 2-chunk run's [1]a,[2]b
    (llama-imatrix --chunk 1 --chunks 2 printed [1]356.9862)."""
    _run(tok2, tmp_path / "c0.gguf", "--chunks", "2", "-b", "32")
    a, b = (float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", capsys.readouterr().out))
    _run(tok2, tmp_path / "c0.gguf", "--chunks", "1", "-b", "32")
    _run(tok2, tmp_path / "c12.gguf", "--chunk", "1", "--chunks", "2", "-b", "32")
    first = float(re.findall(r"\[1\]([0-9.]+),", capsys.readouterr().out)[-1])
    np.testing.assert_allclose(first, b * b / a, rtol=1e-5)
    np.testing.assert_allclose(first, 356.9862, rtol=2e-4)
    _run(tok2, tmp_path / "all.gguf", "--chunks", "3", "-b", "32")
    assert main(["imatrix", "-q", "-c", "32", "--in-file", f"{tmp_path / 'c0.gguf'},{tmp_path / 'c12.gguf'}",
                 "-o", str(tmp_path / "sum.gguf")]) == 0
    _assert_same(load_imatrix(tmp_path / "sum.gguf"), load_imatrix(tmp_path / "all.gguf"), rtol=1e-5)
    assert load_imatrix(tmp_path / "c12.gguf").chunk_count == 2
    # 2157 tokens are 67 chunks of 32: llama-imatrix wants more than two chunks' tokens left after the skip
    _run(tok2, tmp_path / "c65.gguf", "--chunk", "65", "--no-ppl")
    assert load_imatrix(tmp_path / "c65.gguf").chunk_count == 2
    assert main(["imatrix", "-q", "-m", str(tok2), "-f", str(TEXT), "-c", "32", "--chunk", "66",
                 "-o", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "--chunk 66: there will be not enough tokens left after removing 66 chunks" in err
    assert not (tmp_path / "x.gguf").exists()


def test_no_ppl_and_parse_special(tok2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--no-ppl prints no perplexity and collects the same imatrix; --parse-special turns the BOS text into
    the one BOS token (so fewer chunks), without it the text is 17 plain tokens."""
    from pyggml.llm.tokenizer import Vocab

    _run(tok2, tmp_path / "p.gguf", "--chunks", "2", "--ppl")
    assert "Final estimate" in capsys.readouterr().out
    _run(tok2, tmp_path / "n.gguf", "--chunks", "2", "--no-ppl")
    assert capsys.readouterr().out == ""
    _assert_same(load_imatrix(tmp_path / "n.gguf"), load_imatrix(tmp_path / "p.gguf"))
    text = tmp_path / "special.txt"
    text.write_text("<|begin_of_text|>" * 64 + TEXT.read_text(encoding="utf-8")[:1000], encoding="utf-8")
    vocab = Vocab.from_metadata(Model(tok2, progress=False).reader)
    for flags, parse in (([], False), (["--parse-special"], True)):
        _run(tok2, tmp_path / "s.gguf", "--no-ppl", *flags, text=text)
        n = len(vocab.tokenize(text.read_text(encoding="utf-8"), add_special=True, parse_special=parse))
        assert load_imatrix(tmp_path / "s.gguf").chunk_count == n // 32, flags
    assert len(vocab.tokenize("<|begin_of_text|>", add_special=False, parse_special=False)) == 17


@pytest.mark.parametrize(("flags", "needle"), [
    (["-ofreq", "0"], "-ofreq/--output-frequency must be > 0"),
    (["--output-frequency", "-3"], "-ofreq/--output-frequency must be > 0"),
    (["--save-frequency", "-1"], "--save-frequency must be >= 0"),
    (["--chunk", "-1"], "--chunk/--from-chunk must be >= 0"),
    (["--chunks", "0"], "--chunks must be -1 (all) or > 0"),
    (["-b", "48"], "-b/--batch-size (48) must be below -c/--ctx-size (32) or a multiple of it"),
    (["-b", "0"], "-b/--batch-size 0 is out of range"),  # main's check of the shared model flags
])
def test_bad_option_values_are_one_line_errors(tok2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               flags: list[str], needle: str) -> None:
    out = tmp_path / "im.gguf"
    assert main(["imatrix", "-q", "-m", str(tok2), "-f", str(TEXT), "-o", str(out), "-c", "32", *flags]) == 1
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not out.exists()


def test_help_names_llama_imatrix_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["imatrix", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("-b BATCH_SIZE, --batch-size", "-ofreq N, --output-frequency N", "--save-frequency N",
                 "imatrix.gguf.at_20", "--chunk N, --from-chunk N", "--chunks N", "--ppl", "--no-ppl",
                 "--parse-special", "-o FNAME, --output FNAME, --output-file FNAME", "--in-file FNAME",
                 "--process-output", "--show-statistics", "--output-format {gguf,dat}"):
        assert flag in out, flag


def test_gguf_output_without_gguf_suffix_is_warned_about(tok2: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = ["imatrix", "-m", str(tok2), "-f", str(TEXT), "-c", "32", "--chunks", "2", "--no-ppl"]
    assert main([*base, "-o", str(tmp_path / "im.bin")]) == 0
    assert "saving imatrix using GGUF format with a different suffix than .gguf" in capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "im.bin"), "--output-format", "gguf"]) == 0
    assert "different suffix" not in capsys.readouterr().err
