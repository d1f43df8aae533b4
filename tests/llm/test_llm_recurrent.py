"""Recurrent (Mamba) and hybrid models: logits against llama.cpp, and the recurrent memory's behaviour.

The tiny models and llama.cpp 0c1e570's logits (every position of a 24-token prompt, n_ctx 64, 2 threads)
and 8 greedy tokens were written by tests/data/archs/make_recurrent.py into recurrent.npz. The memory
tests check llama.cpp's semantics (llama-memory-recurrent.cpp): one state per sequence, seq_cp shares a
state that the next write copies, seq_rm only drops whole states, a failed or aborted decode restores
every state, and a saved sequence state continues as the original.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.llamacpp_match import assert_logits_and_greedy
from pyggml.llm.batch import Batch, DecodeError
from pyggml.llm.context import ContextParams, DecodeAborted, LlamaContext
from pyggml.llm.model import Model

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = np.load(DATA / "recurrent.npz")
CASES = sorted(tuple(k[: -len("-logits")].rsplit("-", 1)) for k in REF.files if k.endswith("-logits"))
TOKENS = REF["tokens"].tolist()


def _model(arch: str, kind: str = "f32") -> Model:
    return Model(DATA / (f"{arch}.gguf" if kind == "f32" else f"{arch}-{kind}.gguf"), progress=False)


def _ctx(model: Model, n_seq_max: int = 1, n_ubatch: int = 64) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=64, n_batch=64, n_ubatch=n_ubatch, n_threads=2,
                                             n_seq_max=n_seq_max))


@pytest.fixture(scope="module", params=["mamba2", "granitehybrid"])
def model(request: pytest.FixtureRequest) -> Model:
    """A recurrent model (Mamba-2), and a hybrid one whose attention layer keeps a KV cache beside the states."""
    return _model(request.param)


@pytest.mark.parametrize(("arch", "kind"), CASES, ids=[f"{a}-{k}" for a, k in CASES])
def test_logits_and_greedy_equal_llamacpp(arch: str, kind: str) -> None:
    """F32 and Q8_0 files (the SSM convs, A, D and norms stay F32 in both)."""
    assert_logits_and_greedy(_ctx(_model(arch, kind)), TOKENS, REF[f"{arch}-{kind}-logits"],
                             REF[f"{arch}-{kind}-greedy"], f"{arch} {kind}")


def _alone(model: Model, prompt: list[int], cont: list[int]) -> np.ndarray:
    ctx = _ctx(model)
    ctx.decode(prompt)
    return ctx.decode(cont, outputs=[True] * len(cont))


def test_sequences_decoded_together_equal_each_alone(model: Model) -> None:
    """A shared prompt copied with seq_cp, each copy extended differently in one batch (split_equal: equal
    runs per sequence), then seq_rm of one and seq_keep of another: every sequence's logits are the ones it
    gets decoded alone."""
    prompt, conts = TOKENS[:10], [TOKENS[10:14], TOKENS[14:18], TOKENS[18:22]]
    ctx = _ctx(model, n_seq_max=3)
    ctx.decode(prompt)
    for s in (1, 2):
        ctx.seq_cp(0, s)
    assert [ctx.seq_pos_max(s) for s in range(3)] == [9, 9, 9]
    n = len(conts[0])
    batch = Batch(token=[t for c in conts for t in c], seq_id=[s for s in range(3) for _ in range(n)],
                  logits=[True] * (3 * n))
    out = ctx.decode_batch(batch)
    for s, c in enumerate(conts):
        np.testing.assert_allclose(out[s * n : (s + 1) * n], _alone(model, prompt, c), rtol=1e-5, atol=1e-5)
    assert ctx.seq_rm(1, -1, -1) and ctx.seq_pos_max(1) == -1
    ctx.seq_keep(2)
    assert (ctx.seq_pos_max(0), ctx.seq_pos_max(2)) == (-1, 13)
    # sequence 2 goes on from its state; sequence 0 starts afresh from a zeroed state in the same batch
    out = ctx.decode_batch(Batch(token=[5, 6, 7, 8], seq_id=[2, 2, 0, 0], pos=[14, 15, 0, 1], logits=[True] * 4))
    np.testing.assert_allclose(out[:2], _alone(model, prompt + conts[2], [5, 6]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2:], _ctx(model).decode([7, 8], outputs=[True, True]), rtol=1e-5, atol=1e-5)


def test_seq_rm_drops_only_whole_states(model: Model) -> None:
    """llama.cpp's rule: the state of an earlier position is gone, so [p0, end) with p0 > 0 is refused (False,
    nothing changed); a range before the last position changes nothing; from 0 drops the sequence."""
    ctx = _ctx(model)
    ctx.decode(TOKENS[:8])
    assert ctx.seq_rm(0, 4, -1) is False and ctx.seq_pos_max(0) == 7
    assert ctx.seq_rm(0, 2, 5) is True and ctx.seq_pos_max(0) == 7
    assert ctx.seq_rm(-1, 3, -1) is False
    assert ctx.seq_rm(0, 0, -1) is True and ctx.seq_pos_max(0) == -1


def test_coupled_sequences_are_refused() -> None:
    ctx = _ctx(_model("mamba2"), n_seq_max=2)
    with pytest.raises(DecodeError, match="coupled"):
        ctx.decode_batch(Batch(token=[3, 4], seq_id=[[0, 1], [0, 1]]))


def _states(ctx: LlamaContext) -> list[np.ndarray]:
    return ctx.recr.state_rows()


def test_a_failure_in_the_second_ubatch_restores_every_state(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ubatch has rolled the states forward when the second fails (an exception after it ran, or an
    abort part-way through its graph): states, positions and cells are all as before the call."""
    ctx = _ctx(model, n_ubatch=8)
    ctx.decode(TOKENS[:4])
    before, cells = _states(ctx), ctx.recr.state()
    ref = _ctx(model, n_ubatch=8)
    ref.decode(TOKENS[:4])
    want = ref.decode(TOKENS[4:24])
    real = ctx._process_ubatch
    calls = []

    def failing(*args: object) -> None:
        calls.append(1)
        real(*args)
        if len(calls) == 2:
            raise RuntimeError("injected failure after the second ubatch ran")

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    with pytest.raises(RuntimeError, match="injected"):
        ctx.decode(TOKENS[4:24])
    monkeypatch.setattr(ctx, "_process_ubatch", real)
    assert ctx.recr.state() == cells and ctx.seq_pos_max(0) == 3
    for a, b in zip(_states(ctx), before, strict=True):
        np.testing.assert_array_equal(a, b)
    asked = []
    ctx.set_abort_callback(lambda: asked.append(1) or len(asked) > 90)  # part-way through the second ubatch
    with pytest.raises(DecodeAborted):
        ctx.decode(TOKENS[4:24])
    ctx.set_abort_callback(None)
    assert len(asked) > 90 and ctx.seq_pos_max(0) == 3
    for a, b in zip(_states(ctx), before, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ctx.decode(TOKENS[4:24]), want)


def test_a_token_step_is_one_graph_and_an_aborted_one_changes_nothing(model: Model) -> None:
    """A single-token step writes its new states into the cells' other rows, which the cells move to once its
    graph has run: a step aborted part-way changes no state, and the next one gives the logits of a run that
    never failed. A new sequence's first token runs the same graph as its next ones (it reads the memory's
    zero row, where llama.cpp zeroes a cell in the graph)."""
    ctx = _ctx(model)
    ctx.decode(TOKENS[:1])
    builds = ctx.n_graph_builds
    ctx.decode(TOKENS[1:2])
    assert ctx.n_graph_builds == builds
    before, cells = _states(ctx), ctx.recr.state()
    asked: list[int] = []
    ctx.set_abort_callback(lambda: asked.append(1) and False)
    ref = _ctx(model)
    ref.decode(TOKENS[:2])
    ref.set_abort_callback(ctx.abort_callback)
    want = ref.decode(TOKENS[2:3])
    n_nodes, asked[:] = len(asked), []
    ctx.set_abort_callback(lambda: asked.append(1) or len(asked) > n_nodes // 2)
    with pytest.raises(DecodeAborted):
        ctx.decode(TOKENS[2:3])
    ctx.set_abort_callback(None)
    assert n_nodes > 20 and ctx.recr.state() == cells and ctx.seq_pos_max(0) == 1
    for a, b in zip(_states(ctx), before, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ctx.decode(TOKENS[2:3]), want)


def test_a_saved_state_continues_identically(model: Model, tmp_path: Path) -> None:
    """state_seq_get/set_data and the ggsq file round trip: the restored sequence (into another sequence id
    and another context) gives the original's next logits bit for bit; a truncated state is refused."""
    ctx = _ctx(model, n_seq_max=2)
    ctx.decode(TOKENS[:12])
    data = ctx.state_seq_get_data(0)
    want = ctx.decode(TOKENS[12:16], outputs=[True] * 4)
    other = _ctx(model, n_seq_max=2)
    assert other.state_seq_set_data(data, 1) == len(data) and other.seq_pos_max(1) == 11
    got = other.decode(TOKENS[12:16], outputs=[True] * 4, seq_id=1)
    np.testing.assert_array_equal(got, want)
    path = tmp_path / "seq.ggsq"
    ctx2 = _ctx(model)
    ctx2.decode(TOKENS[:12])
    ctx2.state_seq_save_file(path, 0, TOKENS[:12])
    fresh = _ctx(model)
    assert fresh.state_seq_load_file(path, 0) == TOKENS[:12]
    np.testing.assert_array_equal(fresh.decode(TOKENS[12:16], outputs=[True] * 4), want)
    from pyggml.llm.state import StateError

    with pytest.raises(StateError, match="truncated"):
        fresh.state_seq_set_data(data[:-8], 0)
    assert fresh.seq_pos_max(0) == -1


def test_embeddings_split_by_sequence(model: Model) -> None:
    """With embeddings every token is an output and the batch is split sequence by sequence (split_seq): two
    sequences pooled in one batch get the vectors each gets alone."""
    from pyggml.llm.hparams import PoolingType

    def ctx(n_seq_max: int) -> LlamaContext:
        return LlamaContext(model, ContextParams(n_ctx=64, n_threads=2, n_seq_max=n_seq_max, embeddings=True,
                                                 pooling_type=PoolingType.MEAN))

    both = ctx(2)
    both.decode_batch(Batch(token=TOKENS[:5], seq_id=[0, 0, 0, 1, 1]))
    for s, toks in ((0, TOKENS[:3]), (1, TOKENS[3:5])):
        alone = ctx(1)
        alone.decode_batch(Batch(token=toks))
        np.testing.assert_allclose(both.get_embeddings_seq(s), alone.get_embeddings_seq(0), rtol=1e-5, atol=1e-6)


def test_a_state_of_another_model_is_refused() -> None:
    """A Mamba-2 sequence state read into a Mamba context: its rows have another width, so it is refused
    (StateError naming the layer) and the sequence holds nothing."""
    from pyggml.llm.state import StateError

    src = _ctx(_model("mamba2"))
    src.decode(TOKENS[:6])
    dst = _ctx(_model("mamba"))
    dst.decode(TOKENS[:2])
    with pytest.raises(StateError, match="layer 0: the state's r rows"):
        dst.state_seq_set_data(src.state_seq_get_data(0), 0)
    assert dst.seq_pos_max(0) == -1


def test_llama_api_reuses_no_prefix_a_state_cannot_be_cut_to() -> None:
    """The Llama API keeps the prompt prefix it shares with what was evaluated; a recurrent memory refuses
    to cut its state back to it, so the prompt is evaluated anew and the completion is a fresh model's."""
    from pyggml.llama import Llama

    path = str(DATA / "mamba2.gguf")
    llm = Llama(path, n_ctx=64, verbose=False)
    llm.create_completion("hello there friend", max_tokens=4, temperature=0)
    again = llm.create_completion("hello there", max_tokens=4, temperature=0)["choices"][0]["text"]
    fresh = Llama(path, n_ctx=64, verbose=False).create_completion("hello there", max_tokens=4, temperature=0)
    assert again == fresh["choices"][0]["text"]
