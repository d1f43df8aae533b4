"""Speculative decoding gives plain decoding's tokens, whatever the draft: the target model checks every
drafted token, so a good draft only saves decodes and a bad one only costs them.

The models are the tiny random-weight ones of tests/data/archs, which share a 256-token byte vocabulary:
the llama model drafting for itself agrees with itself; the qwen2 model, other random weights, drafting
for the llama model almost never agrees; a drafter that proposes the wrong token on purpose never does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pyggml.cli.main import main
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.generate import Generation, generate
from pyggml.llm.model import Model
from pyggml.llm.sampling import Sampler, SamplingParams
from pyggml.llm.speculative import (
    ModelDrafter,
    NgramDrafter,
    SpecParams,
    SpeculativeError,
    Speculator,
    check_vocab_compatible,
    make_drafters,
    ngram_simple_draft,
    pad_draft,
)
from pyggml.llm.tokenizer import Vocab

ARCHS = Path(__file__).resolve().parents[1] / "data" / "archs"
PROMPT = "hello world, the cat sat on the mat. the cat sat on"
N_PREDICT = 48
GREEDY = SamplingParams(temp=0.0)


@pytest.fixture(scope="module")
def target() -> tuple[Model, Vocab]:
    m = Model(ARCHS / "llama.gguf", progress=False)
    return m, Vocab.from_metadata(m.reader)


@pytest.fixture(scope="module")
def other() -> Model:
    """Another tiny model with the same vocabulary: a draft that (nearly) always disagrees."""
    return Model(ARCHS / "qwen2.gguf", progress=False)


def _ctx(model: Model, n_ctx: int = 256) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=n_ctx, n_threads=1))


def _run(target: tuple[Model, Vocab], drafters: Sequence | None, params: SamplingParams = GREEDY,
         n_predict: int = N_PREDICT, n_ctx: int = 256, pad_to: int = 0, **kw) -> tuple[Generation, Speculator | None]:
    model, vocab = target
    ctx = _ctx(model, n_ctx)
    spec = Speculator(ctx, drafters, pad_to=pad_to) if drafters is not None else None
    prompt = vocab.tokenize(PROMPT, add_special=True)
    out = generate(ctx, vocab, prompt, Sampler(params), n_predict, ignore_eos=True, speculator=spec, n_ctx=n_ctx,
                   **kw)
    return out, spec


@pytest.fixture(scope="module")
def plain(target) -> Generation:
    return _run(target, None)[0]


class Oracle:
    """Drafts from a known continuation: the right tokens (``wrong=False``) or each one plus one (never right)."""

    name = "oracle"

    def __init__(self, sequence: list[int], n_max: int, wrong: bool = False) -> None:
        self.sequence, self.n_max, self.wrong = sequence, n_max, wrong

    def begin(self, history, seq_id=0) -> None:
        pass

    def draft(self, history, last, n_max, seq_id=0) -> list[int]:
        nxt = self.sequence[len(history) + 1 : len(history) + 1 + min(n_max, self.n_max)]
        return [(t + 1) % 256 for t in nxt] if self.wrong else nxt


@pytest.mark.parametrize("n_max", [1, 3, 8])
def test_self_draft_is_plain_greedy_and_accepted(target, plain, n_max):
    out, spec = _run(target, [ModelDrafter(_ctx(target[0]), n_max)])
    assert out.tokens == plain.tokens and out.text == plain.text and out.stop_reason == plain.stop_reason
    assert spec.stats.n_accepted == spec.stats.n_drafted > 0  # the model always agrees with itself
    assert spec.stats.n_steps < N_PREDICT


@pytest.mark.parametrize("n_max", [2, 5])
def test_disagreeing_draft_model_is_plain_greedy(target, other, plain, n_max):
    out, spec = _run(target, [ModelDrafter(_ctx(other), n_max)])
    assert out.tokens == plain.tokens
    assert spec.stats.n_drafted > 0 and spec.stats.acceptance < 0.5


def test_draft_p_min_stops_where_the_top_token_is_less_likely(target):
    """A draft ends before the first token whose probability among the draft's 10 best logits is below p_min
    (llama.cpp's draft sampler); with p_min 0 it always runs to n_max."""
    model, vocab = target
    prompt = vocab.tokenize(PROMPT, add_special=True)
    ref = _ctx(model)
    ref.decode(prompt)
    probs, toks = [], []
    logits = ref.decode([prompt[-1]], positions=[len(prompt)])[-1]  # the draft below decodes the last token again
    for _ in range(6):
        top = np.sort(logits)[-10:].astype(np.float64)
        toks.append(int(np.argmax(logits)))
        probs.append(1.0 / np.exp(top - logits.max()).sum())
        logits = ref.decode([toks[-1]], positions=[len(prompt) + len(toks)])[-1]
    assert toks == ModelDrafter(_ctx(model), 6).draft(prompt, prompt[-1], 6)
    p_min = (sorted(probs)[2] + sorted(probs)[3]) / 2  # between two of them: some drafted tokens pass, some not
    want = next((i for i, p in enumerate(probs) if p < p_min), 6)
    assert 0 <= want < 6
    assert ModelDrafter(_ctx(model), 6, p_min=p_min).draft(prompt, prompt[-1], 6) == toks[:want]


@pytest.mark.parametrize("n_max", [1, 4, 16])
def test_always_wrong_draft_is_plain_greedy(target, plain, n_max):
    seq = target[1].tokenize(PROMPT, add_special=True) + plain.tokens
    out, spec = _run(target, [Oracle(seq, n_max, wrong=True)])
    assert out.tokens == plain.tokens
    # one token per step; the last step, with one token left to make, drafts nothing
    assert spec.stats.n_accepted == 0 and spec.stats.n_drafts == spec.stats.n_steps - 1 == N_PREDICT - 2


@pytest.mark.parametrize("n_max", [2, 7])
def test_right_draft_saves_the_decodes(target, plain, n_max):
    """Every draft token accepted: each step yields n_max + 1 tokens (the first comes from the prompt)."""
    seq = target[1].tokenize(PROMPT, add_special=True) + plain.tokens
    out, spec = _run(target, [Oracle(seq, n_max)])
    assert out.tokens == plain.tokens
    assert spec.stats.n_steps == math.ceil((N_PREDICT - 1) / (n_max + 1))


@pytest.mark.parametrize(("size_n", "size_m", "pad_to"), [(1, 4, 4), (2, 8, 0), (4, 16, 16)])
def test_ngram_lookup_is_plain_greedy(target, plain, size_n, size_m, pad_to):
    out, spec = _run(target, [NgramDrafter(size_n, size_m)], pad_to=pad_to)
    assert out.tokens == plain.tokens
    assert spec.stats.n_accepted > 0  # the tiny model's greedy text loops: lookup finds it


def test_pad_draft():
    assert pad_draft([5, 6], 5) == [5, 6, 6, 6, 6]
    assert pad_draft([5], 6) == [5]  # 5 short: a new graph costs less than 5 wasted positions
    assert pad_draft([], 4) == [] and pad_draft([1, 2, 3], 2) == [1, 2, 3]


def test_ngram_and_draft_model_chained(target, other, plain):
    drafters = make_drafters(SpecParams(types=("draft-simple", "ngram-simple"), n_max=4, ngram_size_n=2,
                                        ngram_size_m=6), _ctx(other))
    assert [d.name for d in drafters] == ["ngram-simple", "draft-simple"]  # llama.cpp's order of preference
    out, spec = _run(target, drafters)
    assert out.tokens == plain.tokens and set(spec.stats.by_type) == {"ngram-simple", "draft-simple"}


def test_sampling_with_a_seed_is_plain_sampling(target, other):
    """Each token is still sampled from the target's row, once, in order: the same seed gives the same text."""
    params = SamplingParams(temp=0.9, seed=1234)
    ref = _run(target, None, params)[0]
    for drafters in ([ModelDrafter(_ctx(target[0]), 3)], [ModelDrafter(_ctx(other), 3), NgramDrafter(1, 4)]):
        assert _run(target, drafters, params)[0].tokens == ref.tokens


@pytest.mark.parametrize("context_shift", [False, True])
def test_context_limit_as_plain(target, context_shift):
    """A small context: drafts stop short of it, and it fills (or shifts) at the same token as plain."""
    kw = {"n_predict": 90, "n_ctx": 80, "context_shift": context_shift, "n_keep": 4}
    ref = _run(target, None, **kw)[0]
    out, spec = _run(target, [ModelDrafter(_ctx(target[0]), 6), NgramDrafter(2, 8)], **kw)
    assert out.tokens == ref.tokens and out.stop_reason == ref.stop_reason and out.n_shifts == ref.n_shifts
    assert (out.n_shifts > 0) == context_shift and spec.stats.n_accepted > 0


def test_ngram_simple_draft_lookup():
    h = [9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 1, 2]
    assert ngram_simple_draft(h, 3, 3, 4) == [4, 5, 6, 7]  # "1 2 3" seen before: what followed it
    assert ngram_simple_draft(h, 9, 3, 4) == []  # "1 2 9" never seen
    assert ngram_simple_draft(h, 3, 3, 12) == []  # too little history for size_m 12
    assert ngram_simple_draft([5] * 20, 5, 4, 6) == [5] * 6  # a loop shorter than the n-gram is drafted
    # the most recent match followed by size_m tokens wins over a later one followed by fewer
    h = [7, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 1, 2, 8, 9, 1]
    assert ngram_simple_draft(h, 2, 2, 5) == [3, 4, 5, 6, 0]
    assert ngram_simple_draft(h, 2, 2, 3) == [8, 9, 1]  # the later match is followed by size_m tokens
    assert ngram_simple_draft(h[2:], 2, 2, 5) == [8, 9, 1]  # only a short one: at least size_n tokens will do


def _vocab(**kw) -> SimpleNamespace:
    base = {"vocab_type": "BPE", "add_bos": False, "bos": 0, "add_eos": False, "eos": 1,
            "tokens": [f"t{i}" for i in range(300)]}
    base |= kw
    return SimpleNamespace(n_tokens=len(base["tokens"]), **base)


@pytest.mark.parametrize(("draft", "message"), [
    (_vocab(vocab_type="SPM"), "vocabulary type is SPM"),
    (_vocab(add_bos=True), "BOS token differs"),
    (_vocab(tokens=[f"t{i}" for i in range(100)]), "may differ by at most 128"),
    (_vocab(tokens=[f"t{i}" for i in range(7)] + ["x"] + [f"t{i}" for i in range(8, 300)]), "token 7 is 'x'"),
])
def test_incompatible_vocabularies_refused(draft, message):
    check_vocab_compatible(_vocab(), _vocab(tokens=[f"t{i}" for i in range(400)]))  # 100 more tokens: fine
    with pytest.raises(SpeculativeError, match=message):
        check_vocab_compatible(_vocab(), draft)


def test_cli_generate_speculative_equals_plain(capsys):
    base = ["generate", "-m", str(ARCHS / "llama.gguf"), "-p", PROMPT, "-n", "24", "--temp", "0", "--ignore-eos",
            "-c", "256", "-t", "1"]
    assert main([*base, "-q"]) == 0
    ref = capsys.readouterr().out
    for extra in (["-md", str(ARCHS / "qwen2.gguf"), "--draft-max", "4"],
                  ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"]):
        assert main([*base, *extra]) == 0
        out, err = capsys.readouterr()
        assert out == ref and "speculative:" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["-md", str(ARCHS / "bert.gguf")], "vocabulary type is WPM"),
    (["--spec-type", "draft-simple"], "needs a draft model"),
    (["-md", str(ARCHS / "qwen2.gguf"), "--spec-type", "ngram-simple"], "leaves it unused"),
    (["--spec-type", "lookahead"], "unknown speculative type 'lookahead'"),
    (["--spec-type", "ngram-simple", "--spec-draft-n-max", "-1"], "--spec-draft-n-max must be >= 0"),
    (["-md", str(ARCHS / "qwen2.gguf"), "--draft-p-min", "1.5"], "--spec-draft-p-min must be a probability"),
    (["-md", "/nonexistent/draft.gguf"], "draft model file not found"),
])
def test_cli_bad_speculative_flags(capsys, extra, message):
    assert main(["generate", "-m", str(ARCHS / "llama.gguf"), "-p", "hi", "-n", "2", "-q", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
