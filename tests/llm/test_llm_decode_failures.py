"""A decode that fails or is aborted part-way leaves the context exactly as before the call.

A long prompt is decoded in several ubatches; if a later one fails (an error, the abort callback,
Ctrl-C), the cells the earlier ubatches took, the positions and the counters are rolled back, so a
retry gives the logits of a clean run.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.llm.context import ContextParams, DecodeAborted, LlamaContext
from pyggml.llm.model import Model

PROMPT = [2, *range(1000, 1039)]  # 40 tokens: three ubatches of 16


def _ctx(model: Model) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=256, n_batch=64, n_ubatch=16, n_threads=2))


def _state(ctx: LlamaContext) -> tuple:
    return ctx.n_past, {n: (c.pos.copy(), c.head.copy()) for n, c in ctx.caches.items()}


def _same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    for name, (pos, head) in a[1].items():
        np.testing.assert_array_equal(pos, b[1][name][0])
        np.testing.assert_array_equal(head, b[1][name][1])


def test_a_failure_after_the_first_ubatch_changes_nothing(gemma_model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    clean = _ctx(gemma_model)
    clean.decode([2, 5, 6])
    ref = clean.decode(PROMPT[1:])[-1].copy()

    ctx = _ctx(gemma_model)
    ctx.decode([2, 5, 6])
    before = _state(ctx)
    real = ctx._process_ubatch
    calls = []

    def failing(*args: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure in the second ubatch")
        return real(*args)

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    with pytest.raises(RuntimeError, match="injected"):
        ctx.decode(PROMPT[1:])
    _same(_state(ctx), before)
    monkeypatch.setattr(ctx, "_process_ubatch", real)
    np.testing.assert_array_equal(ctx.decode(PROMPT[1:])[-1], ref)


def test_an_aborted_decode_changes_nothing(gemma_model: Model) -> None:
    clean = _ctx(gemma_model)
    ref = clean.decode(PROMPT)[-1].copy()
    ctx = _ctx(gemma_model)
    asked = []
    ctx.set_abort_callback(lambda: asked.append(1) or len(asked) > 700)  # part-way through the second ubatch
    with pytest.raises(DecodeAborted):
        ctx.decode(PROMPT)
    assert ctx.n_past == 0 and all(c.used == 0 for c in ctx.caches.values())
    ctx.set_abort_callback(None)
    np.testing.assert_array_equal(ctx.decode(PROMPT)[-1], ref)
