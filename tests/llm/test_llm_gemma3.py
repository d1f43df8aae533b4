"""Gemma 3 270M Q4_K_M against llama.cpp's own outputs (tests/data/gemma3, made with llama.cpp 0c1e570).

Same settings as the reference: n_ctx 2048, n_ubatch 512, F16 KV cache with V transposed (no flash
attention). Checks: top-1 token at every prompt position wherever llama.cpp's top-2 margin is at least
0.5; last-position logits with cosine >= 0.999; greedy continuations identical up to the first step
whose reference margin is below 0.3 (``greedy_safe_steps``).
"""


from pathlib import Path

import numpy as np
import pytest

from helpers.data import load_json, load_npz
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model

REF = load_json("gemma3", "reference.json")
LAST = load_npz("gemma3", "last_logits.npz")


def _context(model):
    return LlamaContext(model, ContextParams(n_ctx=2048, n_ubatch=512, n_threads=2))


@pytest.mark.parametrize("i", range(len(REF["prompts"])))
def test_prompt_logits_and_greedy(gemma_model, i):
    p = REF["prompts"][i]
    toks = p["tokens"]
    ctx = _context(gemma_model)
    logits = ctx.decode(toks, outputs=[True] * len(toks))
    checked = 0
    for pos, row in enumerate(p["top10_per_position"]):
        ref_logits = row["logits"]
        if ref_logits[0] - ref_logits[1] >= 0.5:
            assert int(np.argmax(logits[pos])) == row["ids"][0], f"prompt {i} position {pos}"
            checked += 1
    assert checked > 0
    ref_last = LAST[f"p{i}"]
    cos = float(np.dot(logits[-1], ref_last) / (np.linalg.norm(logits[-1]) * np.linalg.norm(ref_last)))
    assert cos >= 0.999, f"prompt {i}: cosine {cos:.5f}"
    # greedy continuation up to the first step llama.cpp itself decided by less than 0.3
    n_safe = p["greedy_safe_steps"]
    got = []
    tok = int(np.argmax(logits[-1]))
    for _ in range(n_safe):
        got.append(tok)
        tok = int(np.argmax(ctx.decode([tok])[-1]))
    assert got == p["greedy_continuation"][:n_safe]
    if n_safe > 1:
        assert ctx.n_reused >= n_safe - 2  # every generation step after the first reused the graph


@pytest.mark.slow
def test_offloaded_layers_give_the_same_greedy_text(gemma_path: Path):
    """-ngl 10 onto the torch device: layers 9..17 and the output head leave the CPU, the scheduler
    splits the graph, and the greedy continuation is unchanged."""
    pytest.importorskip("torch", reason="the torch backend needs torch (pip install -e '.[torch]')")
    from pyggml.backend.registry import backend_dev_by_name

    torch_dev = backend_dev_by_name("TORCH_CPU")
    assert torch_dev is not None
    m = Model(gemma_path, progress=False, n_gpu_layers=10, devices=[torch_dev],
              override_tensor=[(r"blk\.17\.ffn_down", "CPU")])
    assert [d.name() for d in m.devices] == ["TORCH_CPU"]
    assert m.layer_buft(8).name() == "CPU" and m.layer_buft(9).name() == "TORCH_CPU"
    # -ot NAME=CPU keeps a weight on the CPU, in its extra buffer type where that computes it (as llama.cpp's)
    assert m.tensors["blk.17.ffn_down.weight"].buffer.buft.name() in ("CPU", "CPU_REPACK")
    assert not m.output.buffer.is_host()  # the tied embeddings were duplicated for the output layer
    ctx = _context(m)
    p = REF["prompts"][0]
    logits = ctx.decode(p["tokens"])
    assert ctx.sched.n_splits > 1
    got = []
    tok = int(np.argmax(logits[-1]))
    for _ in range(p["greedy_safe_steps"]):
        got.append(tok)
        tok = int(np.argmax(ctx.decode([tok])[-1]))
    assert got == p["greedy_continuation"][: p["greedy_safe_steps"]]


def test_repacked_weights_give_the_same_logits_bits(gemma_model, gemma_path: Path):
    """The default load repacks the weights this CPU has repacked kernels for (CPU_REPACK; never the token
    embeddings, which GET_ROWS reads); --no-repack keeps every weight mapped from the file. The logits of a
    prompt and of a decode step are the same bits either way."""
    from pyggml.backend.cpu.quants import repacked

    plain = Model(gemma_path, progress=False, use_extra_bufts=False)
    moved = [name for name, t in gemma_model.tensors.items() if t.buffer.name() == "CPU_REPACK"]
    assert all(t.buffer.name() == "CPU_Mapped" for t in plain.tensors.values())
    assert "token_embd.weight" not in moved
    expected = {name for name, t in gemma_model.tensors.items()
                if name != "token_embd.weight" and t.type in repacked.TYPES and t.ne[1] % 8 == 0}
    assert set(moved) == expected and (expected or not repacked.TYPES)
    toks = REF["prompts"][0]["tokens"]
    a, b = _context(gemma_model), _context(plain)
    every = [True] * len(toks)
    np.testing.assert_array_equal(a.decode(toks, outputs=every), b.decode(toks, outputs=every))
    np.testing.assert_array_equal(a.decode([toks[1]]), b.decode([toks[1]]))
