"""``pyggml embedding`` on the tiny BERT model against llama.cpp's embeddings of the same texts.

tests/data/archs/make_embeddings.py kept llama.cpp's tokens of the two lines of CLI_PROMPTS and their
unnormalised embeddings (pooled by the file's CLS, and per token); each output format is parsed and compared
with them normalised by numpy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.cli.embedding import process_escapes
from pyggml.cli.main import main
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.hparams import PoolingType
from pyggml.llm.model import Model
from pyggml.llm.tokenizer import Vocab

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = np.load(DATA / "embeddings.npz")
BERT = str(DATA / "bert.gguf")
PROMPTS = "hello world\nthe cat sat on the mat"
BASE = ["embedding", "-m", BERT, "-t", "2", "-q", "-fa", "off"]  # the reference ran without flash attention


def _run(capsys: pytest.CaptureFixture[str], *flags: str, prompt: str = PROMPTS) -> str:
    assert main([*BASE, "-p", prompt, *flags]) == 0
    return capsys.readouterr().out


def _numpy_norm(x: np.ndarray, norm: int) -> np.ndarray:
    x = x.astype(np.float64)
    if norm == -1:
        return x
    if norm == 0:
        return x * 32760.0 / np.abs(x).max(axis=1, keepdims=True)
    return x / (np.abs(x) ** norm).sum(axis=1, keepdims=True) ** (1.0 / norm)


def test_tokens_equal_llamacpp() -> None:
    vocab = Vocab.from_gguf(BERT)
    for i, text in enumerate(PROMPTS.split("\n")):
        assert vocab.tokenize(text, add_special=True, parse_special=True) == REF[f"cli-tokens-{i}"].tolist()


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_json_output_and_normalisation(capsys: pytest.CaptureFixture[str], norm: int) -> None:
    data = json.loads(_run(capsys, "--embd-output-format", "json", "--embd-normalize", str(norm)))
    assert data["object"] == "list" and [d["index"] for d in data["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in data["data"])
    out = np.array([d["embedding"] for d in data["data"]])
    expect = _numpy_norm(REF["cli-bert-cls"], norm)
    if norm == 0:  # integers in the int16 range
        assert np.array_equal(out, np.round(out)) and np.abs(out).max() == 32760
        assert np.abs(out - expect).max() <= 2
    else:
        np.testing.assert_allclose(out, expect, atol=2e-6 * np.abs(expect).max() + 1e-7, rtol=1e-4)


def test_array_and_pooling_none(capsys: pytest.CaptureFixture[str]) -> None:
    out = np.array(json.loads(_run(capsys, "--embd-output-format", "array", "--pooling", "none")))
    ref = REF["cli-bert-none"]  # one row per token of both texts
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, _numpy_norm(ref, 2), atol=1e-5)


def test_json_plus_cosine_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(_run(capsys, "--embd-output-format", "json+"))
    e = _numpy_norm(REF["cli-bert-cls"], 2)
    np.testing.assert_allclose(np.array(data["cosineSimilarity"]), e @ e.T, atol=0.006)


def test_raw_and_separator(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "--embd-output-format", "raw", "--embd-separator", "<#sep#>",
               prompt=PROMPTS.replace("\n", "<#sep#>"))
    rows = np.array([[float(v) for v in line.split()] for line in out.splitlines() if line.strip()])
    np.testing.assert_allclose(rows, _numpy_norm(REF["cli-bert-cls"], 2), atol=1e-6)


def test_file_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """-f: the file's last newline ends it (as llama.cpp's -f), so its two lines are two texts."""
    f = tmp_path / "texts.txt"
    f.write_text(PROMPTS + "\n")
    assert main([*BASE, "-f", str(f), "--embd-output-format", "array"]) == 0
    out = np.array(json.loads(capsys.readouterr().out))
    np.testing.assert_allclose(out, _numpy_norm(REF["cli-bert-cls"], 2), atol=1e-6)


def test_default_summary(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, prompt="hello world\\nthe cat sat on the mat")  # escapes are processed
    lines = out.splitlines()
    first = [float(v) for v in lines[1].split(":")[1].split()]
    assert lines[1].startswith("embedding 0:") and len(first) == 16
    np.testing.assert_allclose(first, _numpy_norm(REF["cli-bert-cls"], 2)[0, :16], atol=2e-6)
    assert "cosine similarity matrix:" in out and lines[-2].endswith("the cat sa")


def test_rank_scores(capsys: pytest.CaptureFixture[str]) -> None:
    """A query and a document joined by [SEP] (the model adds SEP), scored by the classifier head."""
    out = _run(capsys, "--pooling", "rank", "--embd-normalize", "-1", prompt="hello world\tthe cat")
    scores = [float(line.split(":")[1].split()[0]) for line in out.splitlines() if line.startswith("rerank")]
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("rerank")] == ["[yes]", "[no]"]
    model = Model(BERT, progress=False)
    toks = Vocab.from_gguf(BERT).tokenize("hello world[SEP]the cat", add_special=True, parse_special=True)
    ctx = LlamaContext(model, ContextParams(n_ctx=64, n_threads=2, embeddings=True, pooling_type=PoolingType.RANK))
    ctx.decode(toks)
    np.testing.assert_allclose(scores, ctx.get_embeddings_seq(0), atol=6e-4)  # printed with 3 decimals


def test_bad_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([*BASE, "-p", "x", "--embd-output-format", "yaml"]) == 1
    assert "--embd-output-format 'yaml' is not a format" in capsys.readouterr().err
    assert main([*BASE]) == 1
    assert "no text to embed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*BASE, "-p", "x", "--pooling", "max"])
    assert e.value.code == 2 and "invalid choice: 'max'" in capsys.readouterr().err
    assert main([*BASE, "-p", "a b c d e f", "-b", "4", "-c", "4"]) == 1
    assert "more than the batch size (4)" in capsys.readouterr().err


def test_help_explains_formats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["embedding", "--help"])
    out = capsys.readouterr().out
    for words in ("--embd-normalize", "euclidean (default)", "json+", "cosineSimilarity", "--cls-separator",
                  "--pooling", "raw"):
        assert words in out


def test_process_escapes() -> None:
    assert process_escapes(r"a\nb\tc\\d\x41\q\xe9") == "a\nb\tc\\dA\\q\\xe9"
