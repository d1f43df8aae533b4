"""llama.cpp's other samplers (src/llama-sampler.cpp): logit bias, DRY, top-n-sigma, XTC, mirostat v1/v2.

Each works on the :class:`~pyggml.llm.sampling.Candidates` of one step, in float32 with llama.cpp's
order of operations, so that fed the same logits they keep the same candidates in the same order
with the same logits and probabilities (to float32 round-off), and with an RNG seeded alike
(``std::mt19937``) draw the same tokens. The chain that orders them is in :mod:`.sampling`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .sampling import MT19937, Candidates

_F32 = np.float32


def top_k(c: Candidates, k: int) -> None:
    """llama_sampler_top_k: keep the k most likely candidates, sorted."""
    if k <= 0:
        return
    k = min(k, c.ids.size)
    if not c.sorted and k < c.ids.size:
        # a partial sort, as llama.cpp's: select the k largest, then order only those
        part = np.argpartition(-c.logits, k - 1)[:k]
        c.ids, c.logits = c.ids[part], c.logits[part]
    c.sort()
    c.keep(k)



def softmax(c: Candidates, do_sort: bool) -> np.ndarray:
    """llama_sampler_softmax_impl: sort (if asked), then ``p = exp(l - max) / sum`` in float32, the sum
    accumulated in candidate order; the probabilities are kept in ``c.p`` and returned."""
    if do_sort:
        c.sort()
    if c.logits.size == 0:
        c.p = np.zeros(0, _F32)
        return c.p
    mx = c.logits[0] if c.sorted else c.logits.max()
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp((c.logits - mx).astype(_F32), dtype=_F32)
    total = np.add.accumulate(e, dtype=_F32)[-1]
    c.p = (e / total).astype(_F32)
    return c.p


# ---------------------------------------------------------------------- logit bias
def logit_bias(c: Candidates, biases: Sequence[tuple[int, float]]) -> None:
    """llama_sampler_logit_bias: add each (token, bias) to that token's logit (entries for one token add up)."""
    if not biases:
        return
    n = c.ids.size
    missed: list[tuple[int, float]] = []
    for tok, bias in biases:
        if 0 <= tok < n and c.ids[tok] == tok:  # the candidates are still in vocabulary order
            c.logits[tok] = _F32(c.logits[tok] + _F32(bias))
        else:
            missed.append((tok, bias))
    if missed:
        first: dict[int, float] = {}
        for tok, bias in missed:  # llama.cpp applies the first entry it finds for a moved token
            first.setdefault(tok, bias)
        for i, tok in enumerate(c.ids.tolist()):
            if tok in first:
                c.logits[i] = _F32(c.logits[i] + _F32(first[tok]))


def parse_logit_bias(spec: str) -> tuple[int, float]:
    """``--logit-bias TOKEN_ID(+/-)BIAS`` as llama.cpp's common/arg.cpp reads it: ``15043+1``, ``15043-inf``."""
    s = spec.strip()
    i = 1 if s[:1] in "+-" else 0
    while i < len(s) and s[i].isdigit():
        i += 1
    head, sign, rest = s[:i], s[i:i + 1], s[i + 1:]
    try:
        token = int(head)
        if sign not in ("+", "-") or not rest:
            raise ValueError
        bias = float(rest)
    except ValueError:
        raise ValueError(f"--logit-bias expects TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 2-inf), got {spec!r}") \
            from None
    return token, -bias if sign == "-" else bias


# ---------------------------------------------------------------------- top-n-sigma
def top_n_sigma(c: Candidates, n: float) -> None:
    """llama_sampler_top_n_sigma: logits below ``max - n * std`` (over the finite ones) become -inf."""
    if n <= 0.0 or c.logits.size <= 1:
        return
    x = c.logits
    valid = x != -np.inf
    count = int(np.count_nonzero(valid))
    mx = _F32(max(x[0], x[valid].max())) if count else x[0]
    if count:
        total = np.add.accumulate(x[valid], dtype=_F32)[-1]
        mean = _F32(total / _F32(count))
        d = (x[valid] - mean).astype(_F32).astype(np.float64)
        std = _F32(math.sqrt(float(_F32((d * d).sum())) / count))
    else:
        std = _F32(0.0)
    with np.errstate(invalid="ignore"):
        cut = _F32(mx - _F32(_F32(n) * std))
    c.logits = np.where(x < cut, _F32(-np.inf), x).astype(_F32)


# ---------------------------------------------------------------------- XTC
def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, rng: MT19937) -> None:
    """llama_sampler_xtc ("exclude top choices"): with chance ``probability`` drop every candidate whose
    probability is at least ``threshold`` but the least likely of them. Draws from its own RNG."""
    if probability <= 0.0 or threshold > 0.5 or c.ids.size < 2:
        return
    if rng.canonical_f32() > _F32(probability):
        return
    p = softmax(c, True)
    pos_last = 0
    for i in range(p.size):
        if p[i] >= _F32(threshold):
            pos_last = i
        else:
            break
    if p.size - pos_last >= min_keep and pos_last > 0:
        c.ids, c.logits, c.p = c.ids[pos_last:], c.logits[pos_last:], p[pos_last:]


# ---------------------------------------------------------------------- mirostat
def discrete(p: np.ndarray, rng: MT19937) -> int:
    """std::discrete_distribution<int> over ``p`` as libstdc++ draws it: probabilities normalized in
    double, cumulative sums with the last set to 1, the first sum >= one canonical draw (no draw for
    fewer than two candidates)."""
    if p.size < 2:
        return 0
    w = p.astype(np.float64)
    w = w / np.add.accumulate(w)[-1]
    cp = np.add.accumulate(w)
    cp[-1] = 1.0
    return int(np.searchsorted(cp, rng.canonical(), side="left"))


class Mirostat:
    """llama_sampler_mirostat (v1, ``m`` = 100 tokens to estimate the Zipf exponent) and _v2: choose a
    token with surprise near ``tau``, learning the cut ``mu`` at rate ``eta``; the chain's final stage."""

    def __init__(self, version: int, n_vocab: int, tau: float, eta: float, rng: MT19937, m: int = 100) -> None:
        if version not in (1, 2):
            raise ValueError(f"mirostat version must be 1 or 2, got {version}")
        self.version = version
        self.n_vocab = n_vocab
        with np.errstate(over="ignore"):
            self.tau, self.eta, self.m = _F32(tau), _F32(eta), m
            self.mu = _F32(2.0) * self.tau
        self.rng = rng

    def sample(self, c: Candidates) -> int:
        """Choose a token (its index among the candidates is ``c.selected``) and update ``mu``."""
        p = softmax(c, True)
        if self.version == 1:
            s_ti_bi, s_ti_sq = _F32(0.0), _F32(0.0)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                for i in range(min(self.m - 1, p.size - 1)):
                    t_i = np.log(_F32(i + 2) / _F32(i + 1), dtype=_F32)
                    b_i = np.log(_F32(p[i] / p[i + 1]), dtype=_F32)
                    s_ti_bi = _F32(s_ti_bi + _F32(t_i * b_i))
                    s_ti_sq = _F32(s_ti_sq + _F32(t_i * t_i))
                s_hat = _F32(s_ti_bi / s_ti_sq)
                eps = _F32(s_hat - _F32(1.0))
                num = _F32(eps * np.power(_F32(2.0), self.mu, dtype=_F32))
                den = _F32(_F32(1.0) - np.power(_F32(self.n_vocab), -eps, dtype=_F32))
                k = np.power(_F32(num / den), _F32(_F32(1.0) / s_hat), dtype=_F32)
            # C++'s int(k) of a NaN, an infinity or a value past INT_MAX is INT_MIN on x86: top-k then keeps 1
            k_int = int(k) if math.isfinite(float(k)) and float(k) < 2.0**31 else -(2**31)
            top_k(c, max(k_int, 1))
        else:
            with np.errstate(divide="ignore"):
                surprise = -np.log2(p, dtype=_F32)
            over = np.nonzero(surprise > self.mu)[0]
            keep = int(over[0]) if over.size else p.size
            c.keep(max(keep, 1))
        p = softmax(c, True)
        idx = discrete(p, self.rng)
        c.selected = idx
        with np.errstate(divide="ignore"):
            observed = -np.log2(p[idx], dtype=_F32)
        self.mu = _F32(self.mu - _F32(self.eta * _F32(observed - self.tau)))
        return int(c.ids[idx])


# ---------------------------------------------------------------------- DRY
DRY_MAX_CHAR_LEN = 40  # a sequence breaker is cut to this many bytes
DRY_MAX_SEQ_LEN = 20  # and its tail to this many tokens
_FLOAT_MAX_LOG = _F32(88.7228391)


def dry_breakers(vocab: Any, breakers: Iterable[str]) -> dict[int, list[tuple[int, ...]]]:
    """The sequence breakers as llama.cpp's get_overlapping_token_sequences makes them: for every token
    whose text holds a breaker, an empty tail (a one-token breaker); for every token whose text ends with
    a proper prefix of a breaker, the tokens of the rest of the breaker (at most 20)."""
    words, blob, starts = _vocab_texts(vocab)
    out: dict[int, list[tuple[int, ...]]] = {}
    for text in breakers:
        brk = text.encode("utf-8")[:DRY_MAX_CHAR_LEN]
        if not brk:
            continue
        # only tokens holding the breaker's first byte can hold or begin it: find them in the joined texts
        hits = np.frombuffer(blob, dtype=np.uint8) == brk[0]
        toks = np.unique(np.searchsorted(starts, np.nonzero(hits)[0], side="right") - 1)
        tails: dict[int, tuple[int, ...]] = {}  # the rest of the breaker after n bytes, tokenized once
        for tok in toks.tolist():
            word = words[tok]
            if brk in word:
                out.setdefault(tok, []).append(())
                continue
            pos = word.find(brk[:1])
            while pos >= 0:
                n = min(len(brk), len(word) - pos)
                if word[pos:pos + n] == brk[:n]:
                    tail = tails.get(n)
                    if tail is None:
                        tail = tails[n] = tuple(vocab.tokenize(brk[n:].decode("utf-8", "replace"), add_special=False,
                                                               parse_special=False)[:DRY_MAX_SEQ_LEN])
                    seqs = out.setdefault(tok, [])
                    if tail not in seqs:
                        seqs.append(tail)
                pos = word.find(brk[:1], pos + 1)
    return out


def _vocab_texts(vocab: Any) -> tuple[list[bytes], bytes, np.ndarray]:
    """Every token's text (llama_vocab::detokenize of the token alone, specials rendered), joined, and
    where each starts in the joined bytes; kept for the last vocabularies seen (a server builds a DRY
    sampler per request, and detokenizing a 262k-token vocabulary takes most of a second)."""
    hit = _TEXTS.get(id(vocab))
    if hit is None or hit[0] is not vocab:  # an id may be reused once its vocabulary is gone
        words = [vocab.detokenize_bytes([t], remove_special=False, unparse_special=True)
                 for t in range(vocab.n_tokens)]
        starts = np.cumsum([0] + [len(w) for w in words[:-1]], dtype=np.int64)
        if len(_TEXTS) >= 4:
            _TEXTS.pop(next(iter(_TEXTS)))
        hit = _TEXTS[id(vocab)] = (vocab, (words, b"".join(words), starts))
    return hit[1]


_TEXTS: dict[int, tuple[Any, tuple[list[bytes], bytes, np.ndarray]]] = {}


class Dry:
    """llama_sampler_dry ("don't repeat yourself", from koboldcpp): a token that would extend a sequence
    already in the last ``penalty_last_n`` tokens beyond ``allowed_length`` loses
    ``multiplier * base ** (length - allowed_length)``; sequence breakers cut how far back a repeat counts."""

    def __init__(self, multiplier: float, base: float, allowed_length: int, penalty_last_n: int,
                 breakers: dict[int, list[tuple[int, ...]]]) -> None:
        self.multiplier, self.base = _F32(multiplier), _F32(base)
        self.allowed_length = allowed_length
        self.penalty_last_n = max(penalty_last_n, 0)
        self.breakers = breakers
        self.last: deque[int] = deque(maxlen=self.penalty_last_n or None)

    @property
    def enabled(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.penalty_last_n != 0

    def accept(self, token: int) -> None:
        if self.enabled:
            self.last.append(int(token))

    def apply(self, c: Candidates) -> None:
        if not self.enabled:
            return
        n = min(len(self.last), self.penalty_last_n)
        if n <= self.allowed_length:
            return
        last = self.last
        rat = [last[-1 - i] for i in range(n)]  # rat[i]: i tokens back from the newest
        rep_limit = self._rep_limit(rat, n)
        if rep_limit < self.allowed_length:
            return
        counts = self._repeat_counts(rat, n, rep_limit)
        best: dict[int, int] = {}
        for i in range(n - 1):
            r = counts[i]
            if r >= self.allowed_length:
                tok = rat[n - 2 - i]
                if best.get(tok, -1) < r:
                    best[tok] = r
        if not best:
            c.sorted = False
            return
        max_exp = int(_F32(_FLOAT_MAX_LOG / np.log(self.base, dtype=_F32))) if self.base > _F32(1.000001) else 0
        pos = {int(t): i for i, t in enumerate(c.ids)}
        for tok, r in best.items():
            i = pos.get(tok)
            if i is None or () in self.breakers.get(tok, ()):
                continue
            e = r - self.allowed_length
            if max_exp > 0 and e > max_exp:
                e = max_exp
            penalty = _F32(float(self.multiplier) * math.pow(float(self.base), e))
            c.logits[i] = _F32(c.logits[i] - penalty)
        c.sorted = False

    def _rep_limit(self, rat: list[int], n: int) -> int:
        """Step 1: the newest restart sequence (sequence breaker) bounds how long a repeat may be."""
        for i in range(n):
            tails = self.breakers.get(rat[i])
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                k = len(tail)
                if longest < k <= i and all(tail[o] == rat[i - o - 1] for o in range(k)):
                    longest = k
            if longest >= 0:
                return i - longest
        return n

    @staticmethod
    def _repeat_counts(rat: list[int], n: int, rep_limit: int) -> list[int]:
        """Step 2: the Z-algorithm run backwards: ``counts[n-1-k]`` is how many of the newest tokens
        repeat just before position k back (capped at ``rep_limit``)."""
        counts = [0] * n
        last = n - 1
        lt = rt = 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat[m] == rat[m + k]:
                    m += 1
                counts[last - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p = k - lt
                right = rt - k + 1
                if counts[last - p] < right:
                    counts[last - k] = min(counts[last - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat[i] == rat[i - k]:
                        i += 1
                    counts[last - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1
        return counts
