"""Encoders and pooled embeddings against llama.cpp's on the same files (tests/data/archs/embeddings.npz).

bert, nomic-bert and gemma-embedding (no KV cache, non-causal attention, gemma-embedding with its symmetric
sliding window and dense projections) and the decoder qwen2 (KV cache, causal, and made non-causal as
llama-embedding's --attention non-causal does) with embeddings on: one batch of two sequences, each pooling
type; llama.cpp's values were written by tests/data/archs/make_embeddings.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import PyGGMLError
from pyggml.llm.batch import Batch, DecodeError
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.embeddings import embd_normalize, mean_weights, no_cache_mask, pooled_rows
from pyggml.llm.hparams import PoolingType
from pyggml.llm.model import Model

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = np.load(DATA / "embeddings.npz")
CASES = sorted(tuple(k.rsplit("-", 1)) for k in REF.files if k.endswith(("-none", "-mean", "-cls", "-last", "-rank"))
               and not k.startswith("cli-"))
MODELS: dict[str, Model] = {}


def _model(name: str) -> Model:
    if name not in MODELS:
        MODELS[name] = Model(DATA / f"{name}.gguf", progress=False)
    return MODELS[name]


def _context(name: str, pooling: str, **kw: object) -> LlamaContext:
    """``name`` is a model's file (``bert_q8_0``: bert-q8_0.gguf), or ``<file>_noncausal``: its attention made
    non-causal."""
    args: dict = {"n_ctx": 64, "n_batch": 64, "n_ubatch": 64, "n_threads": 2, "n_seq_max": 2} | kw
    if name.endswith("_noncausal"):
        name, args["causal_attn"] = name.removesuffix("_noncausal"), False
    name = name.replace("_q8_0", "-q8_0")
    params = ContextParams(embeddings=True, pooling_type=PoolingType.parse(pooling), **args)
    return LlamaContext(_model(name), params)


def _batch() -> Batch:
    return Batch(token=REF["tokens"].tolist(), pos=REF["pos"].tolist(), seq_id=REF["seq"].tolist())


def _embeddings(ctx: LlamaContext, pooling: str) -> np.ndarray:
    if pooling == "none":
        return np.stack([ctx.get_embeddings_ith(i) for i in range(len(REF["tokens"]))])
    return np.stack([ctx.get_embeddings_seq(s) for s in range(2)])


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_cases_cover_every_encoder_and_pooling() -> None:
    names = {n for n, _ in CASES}
    assert {"bert", "bert_q8_0", "nomic-bert", "gemma-embedding", "qwen2", "qwen2_noncausal"} <= names
    assert {p for _, p in CASES} == {"none", "mean", "cls", "last", "rank"}


@pytest.mark.parametrize(("name", "pooling"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_embeddings_equal_llamacpp(name: str, pooling: str) -> None:
    ctx = _context(name, pooling)
    ctx.decode_batch(_batch())
    out, ref = _embeddings(ctx, pooling), REF[f"{name}-{pooling}"]
    assert out.shape == ref.shape
    cos = _cos(out, ref)
    assert cos.min() >= 0.9999, f"{name} {pooling}: cosine per row {np.round(cos, 6)}"
    if pooling == "rank":  # a reranker's scores, not a direction: the values themselves
        np.testing.assert_allclose(out, ref, atol=1e-4)


def test_flash_attention_encoder_equals_llamacpp() -> None:
    """Flash attention casts the encoder's K/V to F16 (there is no cache to store them in)."""
    ctx = _context("gemma-embedding", "none", flash_attn=True)
    ctx.decode_batch(_batch())
    assert _cos(_embeddings(ctx, "none"), REF["gemma-embedding-none"]).min() >= 0.9999


def test_sequences_alone_equal_sequences_together() -> None:
    """An encoder's sequences attend only to themselves: each alone gives its rows of the batch."""
    ctx = _context("bert", "none")
    toks, n0 = REF["tokens"].tolist(), int((REF["seq"] == 0).sum())
    ctx.decode_batch(Batch(token=toks[n0:]))
    alone = ctx.get_embeddings().copy()
    assert _cos(alone, REF["bert-none"][n0:]).min() >= 0.9999


def test_encoder_context_rules() -> None:
    with pytest.raises(PyGGMLError, match="embeddings=True"):
        LlamaContext(_model("bert"), ContextParams(n_ctx=64))
    ctx = _context("bert", "cls", n_ubatch=16)
    with pytest.raises(DecodeError, match="one ubatch: 34 tokens exceed n_ubatch = 16"):
        ctx.decode_batch(_batch())
    ctx = _context("bert", "cls")
    ctx.decode_batch(_batch())
    with pytest.raises(DecodeError, match="pooling cls"):
        ctx.get_embeddings_ith(0)
    with pytest.raises(DecodeError, match="sequence 5"):
        ctx.get_embeddings_seq(5)
    assert ctx.seq_pos_max(0) == -1  # nothing is remembered
    with pytest.raises(PyGGMLError, match="no memory"):
        ctx.state_seq_get_data(0)


def test_decoder_embeddings_switch_on_and_off() -> None:
    """llama_set_embeddings: a decoder's logits go on; with embeddings every token is an output."""
    ctx = LlamaContext(_model("qwen2"), ContextParams(n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2, n_seq_max=2))
    with pytest.raises(DecodeError, match="without embeddings"):
        ctx.get_embeddings_seq(0)
    ctx.set_embeddings(True)
    logits = ctx.decode_batch(_batch())
    assert logits.shape == (len(REF["tokens"]), 256)
    assert _cos(ctx.get_embeddings(), REF["qwen2-none"]).min() >= 0.9999


def test_non_causal_decoder_needs_one_ubatch() -> None:
    ctx = _context("qwen2_noncausal", "mean", n_ubatch=16)
    with pytest.raises(DecodeError, match="non-causal attention needs the batch in one ubatch"):
        ctx.decode_batch(_batch())


def test_no_cache_mask_rules() -> None:
    pos = np.array([0, 1, 2, 3, 0, 1])
    seq = np.array([0, 0, 0, 0, 1, 1])
    m = no_cache_mask(pos, seq, causal=False)
    assert np.isinf(m[0, 4]) and m[0, 3] == 0 and m[3, 0] == 0  # other sequences masked, both directions open
    assert np.isinf(no_cache_mask(pos, seq, causal=True)[0, 3])
    sym = no_cache_mask(pos, seq, causal=False, n_swa=4, swa_type="symmetric")  # 2 each side
    assert sym[0, 2] == 0 and np.isinf(sym[0, 3]) and sym[3, 1] == 0 and np.isinf(sym[3, 0])
    with pytest.raises(ValueError, match="sliding-window type"):
        no_cache_mask(pos, seq, False, 4, "chunked")


def test_pooling_inputs() -> None:
    mask = np.array([1, 1, 1, 2, 2, 3], dtype=np.uint64)  # token 5 belongs to sequences 0 and 1
    w = mean_weights(mask, [0, 1])
    np.testing.assert_allclose(w, [[0.25, 0.25, 0.25, 0, 0, 0.25], [0, 0, 0, 1 / 3, 1 / 3, 1 / 3]])
    pos = np.array([0, 1, 2, 0, 1, 3])
    assert pooled_rows(mask, [0, 1], pos, last=False).tolist() == [0, 3]
    assert pooled_rows(mask, [0, 1], pos, last=True).tolist() == [5, 5]


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_embd_normalize(norm: int) -> None:
    x = np.array([[3.0, -4.0, 0.5], [0.0, 0.0, 0.0]], dtype=np.float32)
    y = embd_normalize(x, norm)
    if norm == -1:
        expect = x[0]
    elif norm == 0:
        expect = x[0] * 32760.0 / 4.0
    else:
        expect = x[0] / np.sum(np.abs(x[0].astype(np.float64)) ** norm) ** (1 / norm)
    np.testing.assert_allclose(y[0], expect, rtol=1e-6)
    assert not y[1].any()  # a zero vector stays zero
