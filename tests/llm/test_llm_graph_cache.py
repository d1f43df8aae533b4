"""The context's graph cache (llm/graph_cache.py): a shape that comes back (a prompt, then one-token steps,
then the next prompt) takes its built, split, placed and planned graph back instead of building it again,
with the logits of a context that rebuilds at every change of shape; least recently used shapes are evicted,
and a graph placed in compute buffers the allocator has since replaced is built anew."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.backend.cpu import plan as cpu_plan
from pyggml.llm.batch import Batch
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model


@pytest.fixture(scope="module")
def model(tiny_chat_path: Path) -> Model:
    return Model(tiny_chat_path, progress=False)


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the CPU execution plans resolved (one per new split graph)."""
    made: list[int] = []

    class Counted(cpu_plan.GraphPlan):
        def __init__(self, *a, **k) -> None:
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(cpu_plan, "GraphPlan", Counted)
    return made


def _ctx(model: Model, n_graph_cache: int) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=4, n_threads=2,
                                             n_graph_cache=n_graph_cache))


def _serve(ctx: LlamaContext, prompts: list[list[int]], n_steps: int) -> list[np.ndarray]:
    """A server's requests one after another: each prompt in a sequence of its own, then greedy steps."""
    out = []
    for r, prompt in enumerate(prompts):
        seq = r % ctx.n_seq_max
        ctx.seq_rm(seq, -1, -1)
        n = len(prompt)
        logits = ctx.decode_batch(Batch(token=prompt, seq_id=[[seq]] * n, logits=[False] * (n - 1) + [True]))
        out.append(logits.copy())
        for _ in range(n_steps):
            logits = ctx.decode_batch(Batch(token=[int(logits[-1].argmax())], seq_id=[[seq]]))
            out.append(logits.copy())
    return out


def _prompts(n_vocab: int, lengths: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(4)
    return [rng.integers(0, n_vocab, n).tolist() for n in lengths]


def test_a_shape_that_comes_back_is_not_built_again(model: Model, plans: list[int]) -> None:
    prompts = _prompts(model.hparams.n_vocab, [9, 9, 9, 9])
    cached = _ctx(model, 4)
    got = _serve(cached, prompts, 3)
    # the prompt's shape and the step's, each built, split, placed and planned once
    assert cached.n_graph_builds == 2 and cached.n_graph_restores == 2 * len(prompts) - 2
    assert len(plans) == 2  # one split each (every weight on the CPU): one CPU plan each
    plans.clear()
    rebuilt = _ctx(model, 0)
    want = _serve(rebuilt, prompts, 3)
    assert rebuilt.n_graph_builds == 2 * len(prompts) and rebuilt.n_graph_restores == 0
    assert len(plans) == rebuilt.n_graph_builds
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_least_recently_used_shapes_are_evicted(model: Model) -> None:
    prompts = _prompts(model.hparams.n_vocab, [12, 5, 7, 12, 5])
    ctx = _ctx(model, 2)  # the 12-token prompt first: later graphs fit its compute buffers
    got = _serve(ctx, prompts, 1)
    # shapes 12, 1, 5, (1), 7, (1), 12, (1), 5, (1): with two kept, 12 and 5 were pushed out by then
    assert ctx.graph_cache.n_evicted == 4 and ctx.graph_cache.n_stale == 0
    assert ctx.n_graph_builds == 6 and len(ctx.graph_cache) == 2
    want = _serve(_ctx(model, 0), prompts, 1)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_graphs_placed_in_replaced_buffers_are_built_anew(model: Model) -> None:
    prompts = _prompts(model.hparams.n_vocab, [3, 40, 3])
    ctx = _ctx(model, 4)
    generation = ctx.sched.galloc.generation
    got = _serve(ctx, prompts, 2)
    # the 40-token prompt grew the compute buffers: the one-token step's graph and the 3-token prompt's were
    # placed in the old ones, so each is built again when it comes back
    assert ctx.sched.galloc.generation > generation
    assert ctx.graph_cache.n_stale == 2 and ctx.n_graph_builds == 5
    want = _serve(_ctx(model, 0), prompts, 2)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_negative_capacity_is_refused(model: Model) -> None:
    with pytest.raises(ValueError, match="graph cache capacity"):
        _ctx(model, -1)
