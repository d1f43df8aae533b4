"""Flash attention as llama.cpp's default runs it: the logits equal llama.cpp's, bit for bit.

tests/data/archs/flash_attn.npz holds llama.cpp's logits with flash attention on (made by
make_flash_attn.py beside it) for prompts that take ggml-cpu's three FLASH_ATTN_EXT paths: one chunk
per query row (20 tokens), 64 x 64 tiles (100 and 300 tokens) and, for the decodes after 300 tokens
over 512 cells, the split-KV path, whose bits depend on the thread count (2 there and here).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.backend.cpu.threads import available_cores
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = np.load(DATA / "flash_attn.npz")
N_CTX = 1024


@pytest.fixture(scope="module", params=["llama-q8_0", "gemma3-q8_0"])
def model(request: pytest.FixtureRequest) -> tuple[str, Model]:
    return request.param, Model(DATA / f"{request.param}.gguf", progress=False)


@pytest.mark.parametrize("case", ["p20", "p100", "p300"])
def test_flash_attention_logits_equal_llamacpp(model: tuple[str, Model], case: str) -> None:
    if case == "p300" and available_cores() < 2:
        pytest.skip("the split-KV decode's bits depend on the thread count; the reference used 2 threads")
    name, m = model
    ref = {k: REF[f"{name}/{case}/{k}"] for k in ("tokens", "prompt", "greedy", "decode")}
    ctx = LlamaContext(m, ContextParams(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, flash_attn=True))
    toks = ref["tokens"].tolist()
    logits = ctx.decode(toks, outputs=[True] * len(toks))
    np.testing.assert_array_equal(logits[-len(ref["prompt"]):], ref["prompt"])
    for i, t in enumerate(ref["greedy"].tolist()):
        step = ctx.decode([t], positions=[len(toks) + i])[0]
        np.testing.assert_array_equal(step, ref["decode"][i], err_msg=f"decode step {i}")


def test_auto_turns_flash_attention_on_for_the_cpu(model: tuple[str, Model]) -> None:
    """ContextParams(flash_attn=None) is llama.cpp's auto: on for the CPU, and the cache keeps V untransposed."""
    _, m = model
    ctx = LlamaContext(m, ContextParams(n_ctx=64, flash_attn=None))
    assert ctx.flash_attn is True
    assert all(not cache.v_trans for cache in ctx.caches.values())
    assert LlamaContext(m, ContextParams(n_ctx=64)).flash_attn is False  # the Python API's default: off
