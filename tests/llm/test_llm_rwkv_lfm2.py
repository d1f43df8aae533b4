"""The RWKV architectures (rwkv6, rwkv7, rwkv6qwen2, arwkv7) and the LFM2 hybrid on their tiny models against
llama.cpp, and their recurrent state.

tests/data/archs/make_rwkv.py and make_lfm2.py wrote the models (tests/helpers/rwkv_models.py, lfm2_model.py; F32
and Q8_0) and llama.cpp 0c1e570's logits at every position of a 24-token prompt and 8 greedy tokens after it (rwkv.npz,
lfm2.npz); pyggml must give the same logits (cosine >= 0.9999 per position, the same top-1) and the same greedy
tokens. Several sequences in one batch (split into equal runs, n_seqs > 1 in the graph) must each get what they
get alone, and a prompt fed in pieces what it gets in one piece: the token shift and WKV state (LFM2: the conv
window, beside the KV cache) carried by the recurrent memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.llamacpp_match import assert_logits_and_greedy
from pyggml.llm.batch import Batch
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = {**np.load(DATA / "rwkv.npz"), **np.load(DATA / "lfm2.npz")}
ARCHS = ("rwkv6", "rwkv7", "rwkv6qwen2", "arwkv7", "lfm2")
KINDS = ("f32", "q8_0")  # the F32 file and its Q8_0 quantization (pyggml quantize == llama_model_quantize)


def _context(arch: str, kind: str = "f32", **kw: int) -> LlamaContext:
    params = {"n_ctx": 64, "n_batch": 64, "n_ubatch": 64, "n_threads": 2} | kw
    name = f"{arch}.gguf" if kind == "f32" else f"{arch}-{kind}.gguf"
    return LlamaContext(Model(DATA / name, progress=False), ContextParams(**params))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_equal_llamacpp(arch: str, kind: str) -> None:
    assert_logits_and_greedy(_context(arch, kind), REF["tokens"].tolist(), REF[f"{arch}-{kind}-logits"],
                             REF[f"{arch}-{kind}-greedy"], f"{arch} {kind}", top1_margin=None)


@pytest.mark.parametrize("arch", ARCHS)
def test_sequences_together_equal_each_alone(arch: str) -> None:
    """Three prompts of 5 tokens in one batch (one ubatch of 3 runs), then one token each: every sequence's
    logits equal those of a context that decoded only it, and a prompt fed 2 + 3 tokens equals it fed at once."""
    prompts = [REF["tokens"][i:i + 5].tolist() for i in (0, 7, 14)]
    nxt = [11, 22, 33]
    ctx = _context(arch, n_seq_max=3)
    toks = [t for p in prompts for t in p]
    seqs = [s for s, p in enumerate(prompts) for _ in p]
    first = ctx.decode_batch(Batch(token=toks, pos=[i for p in prompts for i in range(len(p))], seq_id=seqs,
                                   logits=[True] * len(toks)))
    second = ctx.decode_batch(Batch(token=nxt, pos=[5] * 3, seq_id=[0, 1, 2], logits=[True] * 3))
    for s, p in enumerate(prompts):
        alone = _context(arch)
        np.testing.assert_allclose(first[5 * s:5 * s + 5], alone.decode(p, outputs=[True] * 5), rtol=0, atol=2e-5)
        np.testing.assert_allclose(second[s], alone.decode([nxt[s]])[0], rtol=0, atol=2e-5)
        pieces = _context(arch)
        pieces.decode(p[:2])
        np.testing.assert_allclose(pieces.decode(p[2:])[0], first[5 * s + 4], rtol=0, atol=2e-5)


@pytest.mark.parametrize("arch", ["rwkv7", "lfm2"])
def test_a_saved_sequence_state_continues_identically(arch: str) -> None:
    """The token shift and WKV state (LFM2: conv window and KV cells) saved with state_seq_get_data and
    restored into another context and sequence id give the original's next logits bit for bit."""
    tokens = REF["tokens"].tolist()
    ctx = _context(arch)
    ctx.decode(tokens[:10])
    data = ctx.state_seq_get_data(0)
    want = ctx.decode(tokens[10:14], outputs=[True] * 4)
    other = _context(arch, n_seq_max=2)
    assert other.state_seq_set_data(data, 1) == len(data)
    np.testing.assert_array_equal(other.decode(tokens[10:14], outputs=[True] * 4, seq_id=1), want)
