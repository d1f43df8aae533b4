"""Several sequences in one batch, as llama.cpp's memory keeps them: a unified cache (cells shared by
sequences) or a stream of cells per sequence (kv_unified=False, split_equal ubatches).

Tiny random llama / qwen2 / gemma3 (sliding window 8) models, F32 KV cache: each sequence decoded together
with others gives the logits of decoding it alone, across ubatch boundaries and after seq_cp / seq_rm /
seq_add; a batch that breaks a rule or fails part-way changes nothing, checked with hypothesis against a
plain model of the cells.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.hf_models import build, convert
from pyggml.errors import PyGGMLError
from pyggml.llm.batch import Batch, DecodeError, prepare, split_equal
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model
from pyggml.llm.state import StateError
from pyggml.types import GGMLType

ARCHS = ["llama", "qwen2", "gemma3"]


@pytest.fixture(scope="module", params=ARCHS)
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Model:
    m, config = build(request.param, seed=11)
    return Model(convert(tmp_path_factory.mktemp(request.param), m, config), progress=False)


def _ctx(model: Model, n_seq_max: int = 4, n_ubatch: int = 512, unified: bool = True) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                                             n_threads=2, type_k=GGMLType.F32, type_v=GGMLType.F32,
                                             kv_unified=unified))


def _alone(model: Model, tokens: list[int]) -> np.ndarray:
    """Every position's logits of one sequence decoded alone in a fresh context."""
    return _ctx(model, n_seq_max=1).decode(tokens, outputs=[True] * len(tokens)).copy()


def _close(a: np.ndarray, b: np.ndarray) -> None:
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert cos.min() >= 0.9999, cos
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))


def _prompts(model: Model, n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.hparams.n_vocab, length).tolist() for _ in range(n)]


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
@pytest.mark.parametrize("n_ubatch", [512, 5])
def test_interleaved_sequences_give_their_own_logits(model: Model, n_ubatch: int, unified: bool) -> None:
    prompts = _prompts(model, 3, 12, seed=1)
    tokens, seqs = [], []
    for i in range(12):  # token i of every sequence, then token i+1: the sequences interleave
        for s, p in enumerate(prompts):
            tokens.append(p[i])
            seqs.append([s])
    ctx = _ctx(model, n_ubatch=n_ubatch, unified=unified)
    ctx.decode_batch(Batch(token=tokens, seq_id=seqs, logits=[True] * len(tokens)))
    for s, p in enumerate(prompts):
        got = np.stack([ctx.get_logits_ith(i * 3 + s) for i in range(12)])
        _close(got, _alone(model, p))
    # then one token per sequence per step, all in one batch
    for step in range(3):
        nxt = [(p[-1] + 7 * (s + 1) + step) % model.hparams.n_vocab for s, p in enumerate(prompts)]
        out = ctx.decode_batch(Batch(token=nxt, seq_id=[[s] for s in range(3)], logits=[True] * 3))
        for s, p in enumerate(prompts):
            p.append(nxt[s])
            _close(out[s][None], _alone(model, p)[-1:])


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
def test_a_shared_prompt_through_seq_cp(model: Model, unified: bool) -> None:
    """llama-batched: the prompt decoded once in sequence 0, its cells shared with 1 and 2 (copied into
    their streams when each sequence has its own)."""
    prompt = _prompts(model, 1, 10, seed=2)[0]
    ctx = _ctx(model, unified=unified)
    ctx.decode(prompt)
    for s in (1, 2):
        ctx.seq_cp(0, s)
    assert [ctx.seq_pos_max(s) for s in range(3)] == [9, 9, 9]
    nxt = [3, 5, 7]
    out = ctx.decode_batch(Batch(token=nxt, seq_id=[[0], [1], [2]], logits=[True] * 3))
    for s in range(3):
        _close(out[s][None], _alone(model, [*prompt, nxt[s]])[-1:])


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
def test_seq_rm_and_seq_add_on_one_sequence(model: Model, unified: bool) -> None:
    a, b = _prompts(model, 2, 12, seed=3)
    ctx = _ctx(model, unified=unified)
    ctx.decode_batch(Batch(token=a + b, seq_id=[[0]] * 12 + [[1]] * 12))
    ctx.seq_rm(1, 6, -1)  # sequence 1 keeps positions 0..5
    assert ctx.seq_pos_max(1) == 5 and ctx.seq_pos_max(0) == 11
    out = ctx.decode([9, 10], seq_id=1, outputs=[True, True])
    _close(out, _alone(model, [*b[:6], 9, 10])[-2:])
    ctx.seq_add(0, 0, -1, 3)  # sequence 0 moves to positions 3..14: RoPE is relative, logits keep
    assert ctx.seq_pos_max(0) == 14
    # the minimum: 3, or in gemma3 the oldest position its sliding-window cache still holds
    assert ctx.seq_pos_min(0) == 3 if "swa" not in ctx.caches else 3 <= ctx.seq_pos_min(0) <= 14
    out = ctx.decode([4], seq_id=0)
    _close(out, _alone(model, [*a, 4])[-1:])


def test_batch_rules(model: Model) -> None:
    ctx = _ctx(model, n_seq_max=2)
    ctx.decode([1, 2, 3])
    bad = [
        (Batch(token=[1], seq_id=[[2]]), "seq_id\\[0\\]\\[0\\] = 2 >= n_seq_max = 2"),
        (Batch(token=[10**6]), "invalid token\\[0\\]"),
        (Batch(token=[1], pos=[5]), "must continue: Y = X \\+ 1"),
        (Batch(token=[1, 2], pos=[3, 5]), "not continuous"),
        (Batch(token=[1, 2], pos=[4, 3], seq_id=[[0], [0]]), "not continuous|decreasing|continue"),
        (Batch(token=[1], pos=[3], seq_id=[[0, 1]]), "coupled to"),  # sequence 1 is empty, 0 holds 0..2
        (Batch(token=[]), "empty"),
    ]
    before = {n: c.state() for n, c in ctx.caches.items()}
    for batch, msg in bad:
        with pytest.raises(DecodeError, match=msg):
            ctx.decode_batch(batch)
        for n, c in ctx.caches.items():
            for x, y in zip(c.state()[:3], before[n][:3], strict=True):
                np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------- memory vs a plain model
class Cells:
    """The reference: a list of [position, set of sequences], changed the way llama.cpp's cells are."""

    def __init__(self) -> None:
        self.cells: list[list] = []

    def seqs_pos(self, s: int) -> list[int]:
        return sorted(p for p, ss in self.cells if s in ss)

    def rm(self, s: int, p0: int, p1: int) -> None:
        hi = 1 << 60 if p1 < 0 else p1
        for c in self.cells:
            if max(p0, 0) <= c[0] < hi and (s < 0 or s in c[1]):
                c[1] = set() if s < 0 else c[1] - {s}
        self.cells = [c for c in self.cells if c[1]]

    def cp(self, a: int, b: int, unified: bool) -> None:
        if unified:  # b shares a's cells
            for c in self.cells:
                if a in c[1]:
                    c[1] = c[1] | {b}
            return
        # b's stream becomes a copy of a's cells
        self.rm(b, -1, -1)
        self.cells += [[p, {b}] for p, ss in self.cells if a in ss]

    def keep(self, s: int) -> None:
        self.cells = [[p, {s}] for p, ss in self.cells if s in ss]

    def add(self, s: int, p0: int, p1: int, d: int) -> None:
        hi = 1 << 60 if p1 < 0 else p1
        for c in self.cells:
            if s in c[1] and max(p0, 0) <= c[0] < hi:
                c[0] += d
        self.cells = [c for c in self.cells if c[0] >= 0]


def _cache_cells(ctx: LlamaContext) -> list[tuple[int, frozenset]]:
    c = ctx.caches["base"]
    return sorted(((int(p), frozenset(s for s in range(64) if int(m) >> s & 1))
                   for p, m in zip(c.pos.ravel(), c.seq.ravel(), strict=True) if p >= 0), key=_cell_key)


def _cell_key(cell: tuple[int, frozenset]) -> tuple[int, list[int]]:
    return cell[0], sorted(cell[1])  # sets are not totally ordered by <


OPS = st.lists(st.one_of(
    st.tuples(st.just("decode"), st.integers(0, 2), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("rm"), st.integers(-1, 2), st.integers(-1, 6), st.integers(-1, 8)),
    st.tuples(st.just("cp"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("keep"), st.integers(0, 2)),
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 4), st.integers(-3, 3)),
), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Model:
    m, config = build("llama", seed=12)
    return Model(convert(tmp_path_factory.mktemp("cells"), m, config), progress=False)


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_memory_operations_follow_the_reference_cells(llama: Model, ops: list[tuple], unified: bool) -> None:
    ctx = _ctx(llama, n_seq_max=3, unified=unified)
    ref = Cells()
    for op in ops:
        kind = op[0]
        if kind == "decode":
            _, s, n, valid = op
            start = ctx.seq_pos_max(s) + 1
            pos = list(range(start, start + n)) if valid else [start + 1 + i for i in range(n)]
            batch = Batch(token=[(7 * i + s) % llama.hparams.n_vocab for i in range(n)], pos=pos, seq_id=[[s]] * n)
            if valid or start == 0:
                ctx.decode_batch(batch)
                ref.cells += [[p, {s}] for p in pos]
            else:
                with pytest.raises(DecodeError):
                    ctx.decode_batch(batch)
        elif kind == "rm":
            ctx.seq_rm(op[1], op[2], op[3])
            ref.rm(op[1], op[2], op[3])
        elif kind == "cp":
            ctx.seq_cp(op[1], op[2])
            if op[1] != op[2]:
                ref.cp(op[1], op[2], unified)
        elif kind == "keep":
            ctx.seq_keep(op[1])
            ref.keep(op[1])
        else:
            ctx.seq_add(op[1], op[2], -1, op[3])
            if op[3]:
                ref.add(op[1], op[2], -1, op[3])
        assert _cache_cells(ctx) == sorted(((p, frozenset(ss)) for p, ss in ref.cells), key=_cell_key), op
        for s in range(3):
            ps = ref.seqs_pos(s)
            assert ctx.seq_pos_max(s) == (ps[-1] if ps else -1)
            assert ctx.seq_pos_min(s) == (ps[0] if ps else -1)


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
def test_a_failure_part_way_changes_no_sequence(llama: Model, monkeypatch: pytest.MonkeyPatch, unified: bool) -> None:
    ctx = _ctx(llama, n_seq_max=3, n_ubatch=4, unified=unified)
    ctx.decode_batch(Batch(token=[1, 2, 3, 4, 5, 6], seq_id=[[0], [1], [2], [0], [1], [2]]))
    before = _cache_cells(ctx)
    real = ctx._process_ubatch
    calls = []

    def failing(*args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")
        real(*args)

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    with pytest.raises(RuntimeError):
        ctx.decode_batch(Batch(token=[7, 8, 9, 10, 11, 12], seq_id=[[0], [1], [2], [0], [1], [2]]))
    assert _cache_cells(ctx) == before



# --------------------------------------------------------------------------- a stream per sequence
def test_split_equal_takes_equal_runs_of_consecutive_sequences() -> None:
    """llama_batch_allocr::split_equal(sequential=True) on a batch of sequences 0, 1, 2 (5, 3, 4 tokens)."""
    seq = [0] * 5 + [1] * 3 + [2] * 4
    b = prepare(Batch(token=list(range(12)), seq_id=[[s] for s in seq]), 100, 8, 3, lambda s: -1, lambda s: -1)
    ubs = split_equal(b, 7, sequential=True)
    # 2 tokens of each (3 each would pass 7), then 1 each (1 runs out); then sequence 0 alone, as
    # sequence 2 does not follow 0, then 2
    assert [(ub.n_seqs, ub.index.tolist()) for ub in ubs] == [
        (3, [0, 1, 5, 6, 8, 9]), (3, [2, 7, 10]), (1, [3, 4]), (1, [11])]
    with pytest.raises(DecodeError, match="several sequences"):
        split_equal(prepare(Batch(token=[1], seq_id=[[0, 1]]), 100, 8, 3, lambda s: -1, lambda s: -1), 7, True)


def test_streams_sizes_and_graph_reuse(llama: Model) -> None:
    """n_ctx split into equal streams (llama.cpp's n_ctx_seq), graphs reused only for the same sequences."""
    ctx = LlamaContext(llama, ContextParams(n_ctx=1000, n_seq_max=3, kv_unified=False, n_threads=2))
    assert (ctx.n_ctx_seq, ctx.n_ctx) == (512, 1536)  # pad(1024 / 3, 256) cells per stream
    assert tuple(ctx.caches["base"].k[0].ne[1:3]) == (512, 3)
    ctx.decode_batch(Batch(token=[1, 2, 3, 4], seq_id=[[0], [1], [0], [1]]))
    builds = ctx.n_graph_builds
    for t in range(3):  # one token each of 0 and 1: the same graph every step
        ctx.decode_batch(Batch(token=[t, t + 1], seq_id=[[0], [1]]))
    assert ctx.n_graph_builds == builds + 1 and ctx.n_reused >= 2
    ctx.decode_batch(Batch(token=[5, 6], seq_id=[[1], [2]]))  # same shapes, other streams: a new graph
    assert ctx.n_graph_builds == builds + 2
    with pytest.raises(PyGGMLError, match="whole sequences"):
        ctx.seq_cp(0, 2, 1, 3)
    ctx.clear()
    with pytest.raises(DecodeError, match="several sequences"):  # one token in two streams
        ctx.decode_batch(Batch(token=[7], seq_id=[[1, 2]]))


# --------------------------------------------------------------------------- sequence state
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "streams"])
def test_a_saved_sequence_continues_where_it_stopped(model: Model, unified: bool, tmp_path) -> None:
    """llama_state_seq_save_file / load_file: a prompt's cells saved from sequence 1, restored into sequence 2
    of another context (F16 cache, V transposed) and into sequence 0 of a third, continue as the original."""
    prompt, other = _prompts(model, 2, 12, seed=5)

    def ctx(**kw: object) -> LlamaContext:
        return LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=3, n_threads=2, kv_unified=unified, **kw))

    src = ctx()
    src.decode_batch(Batch(token=other + prompt, seq_id=[[0]] * 12 + [[1]] * 12))
    path = tmp_path / "prompt.seq"
    size = src.state_seq_save_file(path, 1, prompt)
    assert size == path.stat().st_size and not list(tmp_path.glob(".*tmp"))
    want = src.decode([5, 6], seq_id=1, outputs=[True, True]).copy()
    for dst_seq in (2, 0):
        dst = ctx()
        dst.decode(other[:3], seq_id=dst_seq)  # cells the state replaces
        assert dst.state_seq_load_file(path, dst_seq) == prompt
        # a sliding-window cache saves only the cells still in the window of position 11
        first = 12 - model.hparams.n_swa if "swa" in dst.caches else 0
        assert (dst.seq_pos_min(dst_seq), dst.seq_pos_max(dst_seq)) == (first, 11)
        np.testing.assert_allclose(dst.decode([5, 6], seq_id=dst_seq, outputs=[True, True]), want, atol=1e-4)
    data = src.state_seq_get_data(0)  # the bytes of the file's body, in memory
    fresh = ctx()
    assert fresh.state_seq_set_data(data, 1) == len(data) and fresh.seq_pos_max(1) == 11


def test_a_state_that_does_not_fit_is_refused(model: Model, tmp_path) -> None:
    prompt = _prompts(model, 1, 10, seed=6)[0]
    src = _ctx(model)
    src.decode(prompt)
    path = tmp_path / "p.seq"
    src.state_seq_save_file(path, 0, prompt)
    data = path.read_bytes()
    # a wrong header changes nothing; a bad body leaves the sequence empty (as llama.cpp)
    bad = {"magic": (b"xxxx" + data[4:], 2), "truncated": (data[:-7], -1), "trailing": (data + b"\0", -1)}
    for what, (blob, pos_max) in bad.items():
        (tmp_path / what).write_bytes(blob)
        dst = _ctx(model)
        dst.decode([1, 2, 3], seq_id=1)
        with pytest.raises(StateError, match=r"version|truncated|left after"):
            dst.state_seq_load_file(tmp_path / what, 1)
        assert dst.seq_pos_max(1) == pos_max and dst.caches["base"].used == pos_max + 1, what
    with pytest.raises(StateError, match="stream"):  # a unified cache's state into one with streams
        _ctx(model, unified=False).state_seq_load_file(path, 0)
    with pytest.raises(StateError, match="transposed"):  # flash attention keeps V untransposed
        LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=4, flash_attn=True, type_k=GGMLType.F32,
                                          type_v=GGMLType.F32)).state_seq_load_file(path, 0)
    with pytest.raises(StateError, match="cannot read"):
        src.state_seq_load_file(tmp_path / "missing.seq", 0)


def test_logits_sink_takes_each_ubatch_outputs_instead_of_keeping_them(model: Model) -> None:
    """decode_batch(logits_sink=...) hands every ubatch's outputs over with their batch indices (the logits a
    plain decode returns for those rows) and keeps none; it refuses to run with embeddings on."""
    rng = np.random.default_rng(4)
    n = 40
    batch = Batch(token=rng.integers(1, 200, n).tolist(), pos=list(range(20)) * 2, seq_id=[0] * 20 + [1] * 20,
                  logits=[i % 3 == 0 for i in range(n)])
    plain = _ctx(model, n_ubatch=16)
    want = plain.decode_batch(batch).copy()
    rows = plain.output_ids
    got: dict[int, np.ndarray] = {}
    sizes: list[int] = []

    def sink(idx: np.ndarray, logits: np.ndarray) -> None:
        sizes.append(len(idx))
        got.update(zip(idx.tolist(), logits.copy(), strict=True))

    ctx = _ctx(model, n_ubatch=16)
    assert ctx.decode_batch(batch, logits_sink=sink).shape[0] == 0
    assert sorted(got) == [i for i in range(n) if i % 3 == 0] and len(sizes) == 3  # 40 tokens in ubatches of 16
    for i, row in got.items():
        np.testing.assert_array_equal(row, want[rows[i]])
    ctx.set_embeddings(True)
    with pytest.raises(PyGGMLError, match="logits sink"):
        ctx.decode_batch(Batch(token=[1, 2], pos=[20, 21], seq_id=[0, 0]), logits_sink=sink)
