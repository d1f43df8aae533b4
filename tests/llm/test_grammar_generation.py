"""Constrained generation against llama.cpp: the same text as ``llama-completion --grammar-file G``
(or ``-j SCHEMA``) for greedy and seeded sampling (tests/data/grammar/completion_reference.json, made by
make_completion_reference.py), every generation inside its grammar, and the grammar stage placed as
common_sampler_sample places it (the chain first, the grammar filter only on a refused token)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.generate import generate
from pyggml.llm.grammar import GrammarError, GrammarSampler, GrammarTrigger, LlamaGrammar
from pyggml.llm.grammar.json_schema import json_schema_to_grammar
from pyggml.llm.model import Model
from pyggml.llm.sampling import Sampler, SamplingParams
from pyggml.llm.tokenizer import Vocab

try:
    import jsonschema
except ImportError:  # optional: schema-made outputs are checked with their grammar and json.loads regardless
    jsonschema = None

REF = json.loads((Path(__file__).parent.parent / "data" / "grammar" / "completion_reference.json")
                 .read_text(encoding="utf-8"))


def _cases(model: str) -> list[dict]:
    return [c for c in REF["cases"] if c["model"] == model]


@pytest.fixture(scope="module")
def tiny(tiny_chat_path: Path) -> tuple[Model, Vocab]:
    sha = hashlib.sha256(tiny_chat_path.read_bytes()).hexdigest()
    assert sha == REF["models_sha256"]["tiny-chat"], "the tiny chat model changed: rerun make_completion_reference.py"
    model = Model(tiny_chat_path)
    return model, Vocab.from_metadata(model.reader)


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> tuple[Model, Vocab]:
    model = Model(gemma_path)
    return model, Vocab.from_metadata(model.reader)


def _grammar_text(case: dict) -> str:
    return case["grammar"] if "grammar" in case else json_schema_to_grammar(case["json_schema"])


def _run(model: Model, vocab: Vocab, case: dict) -> tuple[bytes, str]:
    ctx = LlamaContext(model, ContextParams(n_ctx=512, n_threads=2))
    sampler = Sampler(SamplingParams(temp=case.get("temp", 0.0), seed=case.get("seed", 1)),
                      grammar=GrammarSampler(vocab, _grammar_text(case)))
    tokens = vocab.tokenize(case["prompt"], add_special=True, parse_special=True)
    out = generate(ctx, vocab, tokens, sampler, case["n"])
    return b"".join(vocab.token_to_piece(t, special=False) for t in out.tokens), out.stop_reason


def _check(model: Model, vocab: Vocab, case: dict) -> None:
    text, stop = _run(model, vocab, case)
    assert text == bytes.fromhex(case["text_hex"]), (text, case["text"])
    if stop == "eog":  # a finished generation is a whole sentence of the grammar
        valid, pos, err = LlamaGrammar.from_text(_grammar_text(case)).validate(text.decode("utf-8"))
        assert valid, (pos, err)
        if "json_schema" in case:
            value = json.loads(text)
            if jsonschema is not None:
                jsonschema.validate(value, case["json_schema"])


@pytest.mark.parametrize("case", _cases("tiny-chat"), ids=lambda c: f"{c['prompt'][:12]}-t{c.get('temp', 0)}")
def test_tiny_chat_generation_matches_llama_completion(tiny: tuple[Model, Vocab], case: dict) -> None:
    _check(*tiny, case)


@pytest.mark.parametrize("case", _cases("gemma"), ids=lambda c: f"{c['prompt'][:12]}-t{c.get('temp', 0)}")
def test_gemma_generation_matches_llama_completion(gemma: tuple[Model, Vocab], case: dict) -> None:
    _check(*gemma, case)


class _CountingGrammar(GrammarSampler):
    """Counts the full-vocabulary filters: common_sampler_sample filters only after a refusal."""

    n_apply = 0

    def apply(self, logits: np.ndarray) -> np.ndarray:
        self.n_apply += 1
        return super().apply(logits)


def test_grammar_filters_all_candidates_only_after_a_refusal(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    word = vocab.tokenize("the", add_special=False)
    assert len(word) == 1
    eog = min(vocab.eog_ids)
    for temp, n_filters in ((0.8, 1), (0.0, 0)):  # greedy finds the best allowed token without the filter
        g = _CountingGrammar(vocab, 'root ::= "the" [a-z ]*')
        s = Sampler(SamplingParams(temp=temp, seed=3), grammar=g)
        logits = np.random.default_rng(1).standard_normal(vocab.n_tokens).astype(np.float32)
        logits[word[0]] = 50.0  # the sampled token fits: no filter
        assert s.sample(logits) == word[0] and g.n_apply == 0
        t = vocab.tokenize("t", add_special=False)[0]
        logits[word[0]], logits[eog], logits[t] = -5.0, 50.0, 3.0  # EOG refused before "the": resampled
        tok = s.sample(logits)
        assert g.n_apply == n_filters and g.allows(tok) and not vocab.is_eog(tok)
        assert temp > 0 or tok == t  # the best allowed token


def test_greedy_best_allowed_equals_filter_then_argmax(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    rng = np.random.default_rng(5)
    g = GrammarSampler(vocab, json_schema_to_grammar({"type": "object", "properties": {"a": {"type": "string"}}}))
    for piece in ["{", ' "a"', ": ", '"x', "yz", '"']:
        for scale in (1.0, 8.0):
            logits = (rng.standard_normal(vocab.n_tokens) * scale).astype(np.float32)
            logits[rng.integers(0, vocab.n_tokens, 5)] = logits.max()  # ties at the top
            logits[rng.integers(0, vocab.n_tokens, 50)] = -np.inf  # banned tokens (a logit bias)
            assert g.best_allowed(logits) == int(np.argmax(g.apply(logits)))
            assert g.best_allowed(logits, n_scan=1) == int(np.argmax(g.apply(logits)))
        for t in vocab.tokenize(piece, add_special=False):
            g.accept(t)


def test_prompt_tokens_do_not_feed_the_grammar(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    g = GrammarSampler(vocab, 'root ::= "x"')
    s = Sampler(SamplingParams(temp=0.0), grammar=g)
    for t in vocab.tokenize("hello", add_special=False):
        s.accept(t, is_generated=False)  # as generate() does with the prompt
    assert g.grammar.stacks == g.grammar.initial_stacks()
    with pytest.raises(GrammarError, match="Unexpected empty grammar stack"):
        s.accept(vocab.tokenize("hello", add_special=False)[0])


def test_lazy_grammar_waits_for_its_trigger_then_replays_from_the_match(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    g = GrammarSampler(vocab, 'root ::= "<call>" [a-z]+ "</call>"', lazy=True,
                       triggers=[GrammarTrigger("word", "<call>")])
    free = vocab.tokenize("some text ", add_special=False)
    for t in free:
        assert g.allows(t)  # unconstrained while waiting
        g.accept(t)
    assert g.awaiting_trigger and g.allowed_mask().all()
    for t in vocab.tokenize("<call>ab", add_special=False):
        g.accept(t)
    assert not g.awaiting_trigger  # triggered: "<call>" and what followed it were replayed into the grammar
    allowed = g.grammar.token_allowed
    assert allowed(0, b"c") and allowed(0, b"</") and not allowed(0, b"C")
    mask = g.allowed_mask()
    assert not mask[vocab.tokenize(" ", add_special=False)[0]]
    eog = min(vocab.eog_ids)
    assert not g.allows(eog)
    for t in vocab.tokenize("c</call>", add_special=False):
        g.accept(t)
    assert g.allows(eog) and g.grammar.can_end()


def test_lazy_grammar_pattern_and_token_triggers(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    with pytest.raises(GrammarError, match="needs at least one trigger"):
        GrammarSampler(vocab, 'root ::= "a"', lazy=True)
    with pytest.raises(GrammarError, match="unknown grammar trigger kind"):
        GrammarTrigger("regex", "x")
    g = GrammarSampler(vocab, 'root ::= "ab" [0-9]*', lazy=True,
                       triggers=[GrammarTrigger("pattern", r"x+(ab)")])
    for t in vocab.tokenize("zzxxab1", add_special=False):
        g.accept(t)
    assert not g.awaiting_trigger and g.grammar.can_end()  # replayed from the group: "ab1"
    tok = vocab.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(tok) == 1
    g = GrammarSampler(vocab, 'root ::= "x"', lazy=True, triggers=[GrammarTrigger("token", token=tok[0])])
    g.accept(vocab.tokenize("hi", add_special=False)[0])
    assert g.awaiting_trigger
    with pytest.raises(GrammarError):  # the trigger token's own text is fed to the grammar, as llama.cpp
        g.accept(tok[0])


def test_vocabulary_filter_matches_the_one_token_check(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}
    g = GrammarSampler(vocab, json_schema_to_grammar(schema))
    for piece in ["{", ' "s"', ":", ' "', "caf", "é", " x", '"', ",", ' "n":', " 12"]:
        mask = g.allowed_mask()
        one = np.array([g.allows(t) for t in range(vocab.n_tokens)])
        assert (mask == one).all()
        for t in vocab.tokenize(piece, add_special=False):
            g.accept(t)


def test_token_elements_match_token_ids(tiny: tuple[Model, Vocab]) -> None:
    _, vocab = tiny
    special = vocab.tokenize("<|im_start|>", add_special=False, parse_special=True)[0]
    a = vocab.tokenize("a", add_special=False)[0]
    g = GrammarSampler(vocab, f'root ::= <|im_start|> "a" !<[{a}]>')  # a token by its text, then one by id
    mask = g.allowed_mask()
    assert np.flatnonzero(mask).tolist() == [special]
    g.accept(special)
    assert g.allows(a) and not g.allows(special)
    g.accept(a)
    mask = g.allowed_mask()
    assert not mask[a] and mask[special] and not any(mask[t] for t in vocab.eog_ids)
    assert mask.sum() > vocab.n_tokens // 2
    g.accept(special)
    assert g.grammar.can_end() and g.allows(min(vocab.eog_ids))
