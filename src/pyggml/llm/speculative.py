"""Speculative decoding: cheap guesses of the next tokens, checked by the target model in one batch.

As llama.cpp's speculative decoding (common/speculative.cpp, examples/speculative-simple, llama-server's
``-md``): a *drafter* proposes up to k tokens after the last sampled one; the target decodes
``[last, d0, .., dk-1]`` as one batch of k+1 positions, every one an output; its sampler then samples
row 0, and as long as the sampled token equals the draft token at that row it goes on to the next
row. The tokens sampled (the agreeing prefix of the draft plus the first token where the target
disagreed, or one past the whole draft) are exactly what plain decoding would have sampled, one at a
time, from the same logits: the draft only decides how many rows come from one decode. With greedy
sampling the output is plain greedy decoding's; with any other sampler each token is still drawn from
the target's own distribution (llama.cpp's common_sampler_sample_and_accept_n rule). The cells of the
rejected positions are then removed from the KV cache (``seq_rm``).

Two drafters, tried in llama.cpp's order of preference (the first that proposes anything wins):

- ``ngram-simple``: no second model. The last ``size_n`` tokens (the sampled one included) are looked
  up in the tokens before them; at the most recent earlier occurrence, the ``size_m`` tokens that
  followed it are the draft (llama.cpp's common_ngram_simple_draft). Code that repeats or rewrites
  its prompt gets long drafts for free.
- ``draft-simple``: a small model with the same vocabulary (``-md``) decodes greedily up to ``n_max``
  tokens, stopping early when its top token's probability (among its 10 best) falls below ``p_min``;
  a draft shorter than ``n_min`` is dropped. Its context keeps the tokens it has seen, so each step
  decodes only what changed since the last one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import PyGGMLError

#: llama.cpp's --spec-type names this module implements, in its order of preference
SPEC_TYPES = ("ngram-simple", "draft-simple")
#: vocabularies may differ this much in size (SPEC_VOCAB_MAX_SIZE_DIFFERENCE)
VOCAB_MAX_SIZE_DIFFERENCE = 128
#: token texts are compared from this id on (SPEC_VOCAB_CHECK_START_TOKEN_ID: the first few are often specials)
VOCAB_CHECK_START_TOKEN_ID = 5
#: the draft model's candidates its top token's probability is taken among (llama.cpp's draft top-k)
DRAFT_TOP_K = 10
#: a draft is padded to its drafter's full length when it is at most this many tokens short (pad_draft)
PAD_MAX_GAP = 4


class SpeculativeError(PyGGMLError):
    """Speculative decoding cannot run as asked (incompatible draft model, bad parameters)."""


@dataclass
class SpecParams:
    """llama.cpp's common_params_speculative, the parts implemented (its defaults at commit 0c1e570)."""

    types: tuple[str, ...] = ()  # from SPEC_TYPES, in any order (they are tried in SPEC_TYPES's order)
    n_max: int = 3  # --spec-draft-n-max: the most tokens the draft model proposes per step
    n_min: int = 0  # --spec-draft-n-min: a shorter draft-model draft is not used
    p_min: float = 0.0  # --spec-draft-p-min: stop drafting below this top-token probability
    ngram_size_n: int = 12  # --spec-ngram-simple-size-n: tokens of the n-gram looked up
    ngram_size_m: int = 48  # --spec-ngram-simple-size-m: the most tokens drafted after a match

    def check(self) -> None:
        """Refuse what llama.cpp refuses (and an unknown type), naming the parameter."""
        for t in self.types:
            if t not in SPEC_TYPES:
                raise SpeculativeError(f"unknown speculative type {t!r} (pyggml has: none, {', '.join(SPEC_TYPES)})")
        if self.n_max < 0:
            raise SpeculativeError(f"--spec-draft-n-max must be >= 0, got {self.n_max}")
        if self.n_min < 0:
            raise SpeculativeError(f"--spec-draft-n-min must be >= 0, got {self.n_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise SpeculativeError(f"--spec-draft-p-min must be a probability in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_size_n <= 1024:
            raise SpeculativeError(f"--spec-ngram-simple-size-n must be 1 to 1024, got {self.ngram_size_n}")
        if not 1 <= self.ngram_size_m <= 1024:
            raise SpeculativeError(f"--spec-ngram-simple-size-m must be 1 to 1024, got {self.ngram_size_m}")


@dataclass
class SpecStats:
    """What speculation did: verification steps, drafts proposed, draft tokens proposed and accepted."""

    n_steps: int = 0
    n_drafts: int = 0  # steps with a non-empty draft
    n_drafted: int = 0
    n_accepted: int = 0
    t_draft: float = 0.0  # seconds spent drafting
    by_type: dict[str, list[int]] = field(default_factory=dict)  # type -> [drafts, drafted, accepted]

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    def summary(self) -> str:
        s = (f"speculative: {self.n_steps} target steps, {self.n_drafts} drafts, {self.n_accepted}/{self.n_drafted} "
             f"draft tokens accepted ({100 * self.acceptance:.1f}%), {self.t_draft * 1e3:.0f} ms drafting")
        for name, (n, d, a) in self.by_type.items():
            s += f"; {name}: {n} drafts, {a}/{d} accepted"
        return s

    def record(self, name: str, n_drafted: int, n_accepted: int) -> None:
        self.n_drafts += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        row = self.by_type.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += n_drafted
        row[2] += n_accepted


class Drafter(Protocol):
    """Proposes tokens to follow ``history`` (the tokens in the target's cache, in order) and ``last``
    (the token sampled after them, not yet decoded)."""

    name: str

    def begin(self, history: Sequence[int], seq_id: int = 0) -> None:
        """A new generation starts after ``history`` (the prompt): a chance to process it early."""

    def draft(self, history: Sequence[int], last: int, n_max: int, seq_id: int = 0) -> list[int]:
        """At most ``n_max`` tokens; empty when there is no guess worth checking."""
        ...


# ---------------------------------------------------------------------------------------------- vocabularies
def check_vocab_compatible(vocab_tgt: Any, vocab_dft: Any) -> None:
    """llama.cpp's common_speculative_are_compatible: the draft must tokenize as the target does, or its
    token ids mean other things. Raises SpeculativeError naming the first difference."""
    if vocab_tgt.vocab_type != vocab_dft.vocab_type:
        raise SpeculativeError(f"the draft model's vocabulary type is {vocab_dft.vocab_type}, the target's "
                               f"{vocab_tgt.vocab_type}: speculative decoding needs the same tokenizer")
    for what in ("bos", "eos"):
        add_t, add_d = getattr(vocab_tgt, f"add_{what}"), getattr(vocab_dft, f"add_{what}")
        id_t, id_d = getattr(vocab_tgt, what), getattr(vocab_dft, what)
        if add_t != add_d or (add_t and id_t != id_d):
            raise SpeculativeError(f"the draft model's {what.upper()} token differs from the target's (add: "
                                   f"{add_d} vs {add_t}, id: {id_d} vs {id_t})")
    n_t, n_d = vocab_tgt.n_tokens, vocab_dft.n_tokens
    if abs(n_t - n_d) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpeculativeError(f"the draft model has {n_d} tokens, the target {n_t}: the vocabularies may differ "
                               f"by at most {VOCAB_MAX_SIZE_DIFFERENCE} tokens")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(n_t, n_d)):
        if vocab_tgt.tokens[i] != vocab_dft.tokens[i]:
            raise SpeculativeError(f"token {i} is {vocab_dft.tokens[i]!r} in the draft model but "
                                   f"{vocab_tgt.tokens[i]!r} in the target: the vocabularies differ")


# ---------------------------------------------------------------------------------------------- n-gram lookup
def ngram_simple_draft(history: Sequence[int], last: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's ngram-simple lookup: the n-gram ending in ``last`` (``size_n`` tokens, the last
    ``size_n - 1`` of ``history`` and ``last``) is searched for in ``history`` before its own place;
    the tokens that followed a match (at most ``size_m``) are the draft. Nothing is proposed while
    history is shorter than ``size_n + size_m + 1`` tokens, nor from a match followed by fewer than
    ``size_n`` tokens, as in llama.cpp. llama.cpp takes the most recent match and gives up if it is
    such a one; here the most recent match followed by ``size_m`` tokens is taken, else the most recent
    followed by at least ``size_n``: in a loop shorter than the n-gram (small models' greedy output
    often is one) llama.cpp never drafts, here the loop is drafted at full length."""
    cur = len(history)
    if cur <= size_n + size_m + 1:
        return []
    h = np.asarray(history, dtype=np.int64)
    pattern = np.append(h[cur - size_n + 1:], last)
    # a match starting at j covers j .. j+size_n-1 and leaves cur - j - size_n tokens after it (>= size_n);
    # start 0 is skipped, as in llama.cpp
    windows = np.lib.stride_tricks.sliding_window_view(h[: cur - size_n], size_n)
    starts = np.flatnonzero((windows[1:] == pattern).all(axis=1)) + 1
    if starts.size == 0:
        return []
    full = starts[cur - starts - size_n >= size_m]
    j = int(full[-1] if full.size else starts[-1])
    return h[j + size_n : j + size_n + size_m].tolist()


class NgramDrafter:
    """The ``ngram-simple`` drafter: prompt lookup over the target's own tokens, no model."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        self.size_n = size_n
        self.size_m = size_m

    def begin(self, history: Sequence[int], seq_id: int = 0) -> None:
        pass

    def draft(self, history: Sequence[int], last: int, n_max: int, seq_id: int = 0) -> list[int]:
        if n_max <= 0:
            return []
        return ngram_simple_draft(history, last, self.size_n, self.size_m)[:n_max]


# ---------------------------------------------------------------------------------------------- draft model
def _top_prob(logits: np.ndarray, tok: int) -> float:
    """The probability of the draft's greedy token ``tok`` among the DRAFT_TOP_K best (llama.cpp's draft
    sampler: top-k 10, then the first candidate). A partition of the vocabulary (1 ms at 152k), so only asked
    for with a p_min to compare it with."""
    k = min(DRAFT_TOP_K, logits.size)
    top = np.partition(logits, logits.size - k)[logits.size - k:].astype(np.float64)
    return float(1.0 / np.exp(top - logits[tok]).sum())


class ModelDrafter:
    """The ``draft-simple`` drafter: a small model with the target's vocabulary, greedy. ``ctx`` is its own
    LlamaContext (as many sequences as the target's users of it); per sequence the drafter remembers the
    tokens its cells hold, so a step decodes only the tokens accepted since the last one."""

    name = "draft-simple"

    def __init__(self, ctx: Any, n_max: int = 3, n_min: int = 0, p_min: float = 0.0) -> None:
        self.ctx = ctx
        self.n_max = n_max
        self.n_min = n_min
        self.p_min = p_min
        self.cached: dict[int, list[int]] = {}  # seq_id -> tokens at positions 0.. of the draft's cache

    def _sync(self, want: list[int], seq_id: int) -> np.ndarray | None:
        """Make the draft cache hold ``want``, decoding only past the prefix it already holds; the logits
        after its last token (None when ``want`` is empty)."""
        if not want:
            return None
        cached = self.cached.get(seq_id, [])
        keep = 0
        n = min(len(cached), len(want) - 1)  # the last token is always decoded, for its logits
        while keep < n and cached[keep] == want[keep]:
            keep += 1
        ctx = self.ctx
        ctx.seq_rm(seq_id, keep, -1)
        self.cached[seq_id] = want[:keep]
        logits = None
        # the tokens accepted since the last draft (1 to n_max + 1) go as one batch, as llama.cpp decodes them:
        # those few sizes are kept built in the draft context's graph cache (llm/graph_cache.py)
        step = ctx.n_batch
        for s in range(keep, len(want), step):
            chunk = want[s : s + step]
            logits = ctx.decode(chunk, positions=range(s, s + len(chunk)), seq_id=seq_id)
            self.cached[seq_id] = want[: s + len(chunk)]
        assert logits is not None
        return logits[-1]

    def begin(self, history: Sequence[int], seq_id: int = 0) -> None:
        """Decode the prompt on the draft model now, with the target's prompt (not in the first step)."""
        self._sync(list(history), seq_id)

    def draft(self, history: Sequence[int], last: int, n_max: int, seq_id: int = 0) -> list[int]:
        n_max = min(n_max, self.n_max)
        if n_max <= 0:
            return []
        want = [*history, last]
        logits = self._sync(want, seq_id)
        out: list[int] = []
        while logits is not None:
            tok = int(np.argmax(logits))
            if self.p_min > 0 and _top_prob(logits, tok) < self.p_min:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            pos = len(self.cached[seq_id])
            logits = self.ctx.decode([tok], positions=[pos], seq_id=seq_id)[-1]
            self.cached[seq_id].append(tok)
        return out if len(out) >= self.n_min else []

    def forget(self, seq_id: int) -> None:
        """The sequence's cells were cleared elsewhere: start it over."""
        self.cached.pop(seq_id, None)


# ---------------------------------------------------------------------------------------------- the loop
def make_drafters(params: SpecParams, draft_ctx: Any = None) -> list[Drafter]:
    """The drafters ``params.types`` asks for, in llama.cpp's order of preference; the draft-model one
    needs ``draft_ctx`` (and no other wants it)."""
    params.check()
    drafters: list[Drafter] = []
    for t in SPEC_TYPES:
        if t not in params.types:
            continue
        if t == "ngram-simple":
            drafters.append(NgramDrafter(params.ngram_size_n, params.ngram_size_m))
        else:
            if draft_ctx is None:
                raise SpeculativeError("--spec-type draft-simple needs a draft model (-md FILE)")
            drafters.append(ModelDrafter(draft_ctx, params.n_max, params.n_min, params.p_min))
    if draft_ctx is not None and "draft-simple" not in params.types:
        raise SpeculativeError("a draft model was given (-md) but --spec-type does not include draft-simple")
    return drafters


def pad_draft(draft: list[int], n: int) -> list[int]:
    """``draft`` padded to ``n`` tokens with its last token repeated, when it is at most PAD_MAX_GAP short
    (an empty draft stays empty). Any token is a valid guess, so padding changes no output; it keeps
    the verification batch at one size, and a batch of a size the context's graph cache does not hold costs
    pyggml a graph built, allocated and planned anew (100-140 ms on Qwen2.5 0.5B, 1.5-2 one-token steps), where
    each padded position costs about 0.45 of a one-token step: worth it for a few positions, not for many."""
    if not draft or len(draft) >= n or n - len(draft) > PAD_MAX_GAP:
        return draft
    return draft + [draft[-1]] * (n - len(draft))


def accept_rows(sampler: Any, logits: np.ndarray, draft: Sequence[int]) -> list[int]:
    """Sample row 0 of ``logits`` (the rows of [last, d0, .., dk-1]) and go on to row i+1 while the
    token sampled at row i equals draft[i]; every sampled token is accepted by the sampler, as plain
    decoding would. Returns the tokens sampled: 1 to len(draft)+1 of them."""
    ids: list[int] = []
    for i in range(len(draft) + 1):
        tok = sampler.sample(logits[i])
        sampler.accept(tok)
        ids.append(tok)
        if i == len(draft) or tok != draft[i]:
            break
    return ids


class Speculator:
    """Speculative decoding of one sequence of a target context: ``step`` replaces plain decoding's
    "decode the last token, sample the next" and returns one or more tokens. ``history`` mirrors the
    tokens in the target's cache for the sequence, in position order."""

    def __init__(self, ctx: Any, drafters: Sequence[Drafter], seq_id: int = 0, pad_to: int = 0) -> None:
        """``pad_to`` > 0: a draft shorter than that is padded (with its last token repeated) so that every
        verification decodes the same number of positions and reuses one graph; see :meth:`step`."""
        if not ctx.caches:
            raise SpeculativeError(f"{ctx.model.hparams.arch} models keep no KV cache: nothing to speculate with")
        self.ctx = ctx
        self.drafters = list(drafters)
        self.seq_id = seq_id
        self.pad_to = pad_to
        self.history: list[int] = []
        self.stats = SpecStats()

    def begin(self, prompt: Sequence[int]) -> None:
        """The prompt has been decoded into the target's cache."""
        self.history = list(prompt)
        for d in self.drafters:
            d.begin(self.history, self.seq_id)

    def draft(self, last: int, n_max: int) -> tuple[str, list[int]]:
        """The first non-empty draft of the drafters (with the drafter's name), at most ``n_max`` tokens."""
        if n_max <= 0:
            return "", []
        t0 = time.perf_counter()
        try:
            for d in self.drafters:
                tokens = d.draft(self.history, last, n_max, self.seq_id)[:n_max]
                if tokens:
                    return d.name, tokens
            return "", []
        finally:
            self.stats.t_draft += time.perf_counter() - t0

    def step(self, sampler: Any, last: int, n_max_tokens: int, n_ctx: int) -> list[int]:
        """Decode ``last`` with a draft after it and return the tokens the sampler picks (at most
        ``n_max_tokens``, at least one). The draft leaves room in the context as llama.cpp's: its
        positions end at most at n_ctx - 2."""
        n_past = len(self.history)
        n_max = min(n_max_tokens - 1, n_ctx - n_past - 2)
        name, draft = self.draft(last, n_max)
        n_real = len(draft)
        draft = pad_draft(draft, min(self.pad_to, n_max))
        n = len(draft) + 1
        logits = self.ctx.decode([last, *draft], positions=range(n_past, n_past + n), outputs=[True] * n,
                                 seq_id=self.seq_id)
        ids = accept_rows(sampler, logits, draft)
        if len(ids) < n:  # the rejected draft positions leave the cache
            self.ctx.seq_rm(self.seq_id, n_past + len(ids), -1)
        self.history += [last, *ids[:-1]]
        self.stats.n_steps += 1
        if draft:
            self.stats.record(name, n_real, min(len(ids) - 1, n_real))
        return ids

    def shifted(self, n_keep: int, n_discard: int) -> None:
        """The target's context was shifted (LlamaContext.context_shift): mirror it in ``history``."""
        del self.history[n_keep : n_keep + n_discard]
