"""llama.cpp's sampler chain (common/sampling.cpp, src/llama-sampler.cpp).

Default chain, in llama.cpp's order: penalties -> top_k(40) -> typical(1.0) -> top_p(0.95) ->
min_p(0.05) -> temperature(0.8) -> dist(seed). Samplers whose parameters make them no-ops are
skipped exactly as in llama.cpp; temperature <= 0 keeps only the first maximum, so ``--temp 0``
is greedy. ``dist`` draws from ``std::mt19937(seed)`` through libstdc++'s
``generate_canonical<double, 53>`` (two 32-bit outputs), so a seed picks the same token as
llama.cpp given the same logits.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


@dataclass
class SamplingParams:
    seed: int = LLAMA_DEFAULT_SEED  # LLAMA_DEFAULT_SEED: a random seed
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typ_p: float = 1.0
    temp: float = 0.8
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    min_keep: int = 0


class Candidates:
    """llama_token_data_array: ids and logits, possibly sorted by descending logit."""

    __slots__ = ("ids", "logits", "sorted")

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = np.array(logits, dtype=np.float32).reshape(-1)
        self.ids = np.arange(self.logits.size, dtype=np.int64)
        self.sorted = False

    def sort(self) -> None:
        if not self.sorted:
            order = np.argsort(-self.logits, kind="stable")
            self.ids, self.logits = self.ids[order], self.logits[order]
            self.sorted = True

    def keep(self, n: int) -> None:
        self.ids, self.logits = self.ids[:n], self.logits[:n]

    def probs(self) -> np.ndarray:
        """Softmax over the candidates in float32, as llama_sampler_softmax_impl."""
        e = np.exp(self.logits - self.logits.max(), dtype=np.float32)
        return (e / np.float32(e.sum(dtype=np.float32))).astype(np.float32)


class MT19937:
    """std::mt19937 seeded like the C++ constructor, yielding 32-bit outputs."""

    def __init__(self, seed: int) -> None:
        self._rs = np.random.RandomState(seed & 0xFFFFFFFF)  # legacy seeding == init_genrand

    def next_u32(self) -> int:
        return int(self._rs.randint(0, 2**32, dtype=np.uint64))

    def canonical(self) -> float:
        """std::generate_canonical<double, 53> as libstdc++ computes it from two draws."""
        r1 = self.next_u32()
        r2 = self.next_u32()
        u = (r1 + r2 * 4294967296.0) / 18446744073709551616.0
        return u if u < 1.0 else math.nextafter(1.0, 0.0)


def penalties(c: Candidates, history: deque[int], p: SamplingParams) -> None:
    if p.penalty_last_n == 0 or (p.penalty_repeat == 1.0 and p.penalty_freq == 0.0 and p.penalty_present == 0.0):
        return
    counts = Counter(history)
    if not counts:
        return
    pos = {int(t): i for i, t in enumerate(c.ids)} if c.sorted else None
    for tok, n in counts.items():
        i = pos.get(tok) if pos is not None else (tok if 0 <= tok < c.logits.size else None)
        if i is None:
            continue
        v = c.logits[i]
        with np.errstate(over="ignore"):  # huge penalties overflow to -inf in float32, as in llama.cpp
            v = v * p.penalty_repeat if v <= 0 else v / p.penalty_repeat
            f32 = np.float32
            c.logits[i] = v - (f32(n) * f32(p.penalty_freq) + f32(n > 0) * f32(p.penalty_present))
    c.sorted = False


def top_k(c: Candidates, k: int) -> None:
    if k <= 0:
        return
    k = min(k, c.ids.size)
    if not c.sorted and k < c.ids.size:
        # a partial sort, as llama.cpp's: select the k largest, then order only those
        part = np.argpartition(-c.logits, k - 1)[:k]
        c.ids, c.logits = c.ids[part], c.logits[part]
    c.sort()
    c.keep(k)


def typical(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.sort()
    probs = c.probs().astype(np.float64)
    ent = -np.sum(probs * np.log(np.maximum(probs, 1e-45)))
    shifted = np.abs(-np.log(np.maximum(probs, 1e-45)) - ent)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(probs[order])
    last = c.ids.size
    for i in range(c.ids.size):
        if cum[i] > p and i + 1 >= min_keep:
            last = i + 1
            break
    sel = order[:last]
    c.ids, c.logits = c.ids[sel], c.logits[sel]
    c.sorted = False


def top_p(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.sort()
    probs = c.probs()
    cum = np.float32(0.0)
    last = c.ids.size
    for i in range(c.ids.size):
        cum = np.float32(cum + probs[i])
        if cum >= p and i + 1 >= min_keep:
            last = i + 1
            break
    c.keep(last)


def min_p(c: Candidates, p: float, min_keep: int) -> None:
    if p <= 0.0 or c.ids.size == 0:
        return
    c.sort()
    threshold = c.logits[0] + np.float32(math.log(p))
    n = max(int(np.count_nonzero(c.logits >= threshold)), 1, min_keep)
    c.keep(min(n, c.ids.size))


def temperature(c: Candidates, t: float) -> None:
    if t <= 0.0:
        best = int(np.argmax(c.logits))  # the first maximum
        keep = np.full(c.logits.shape, -np.inf, dtype=np.float32)
        keep[best] = c.logits[best]
        c.logits = keep
        return
    c.logits = (c.logits / np.float32(t)).astype(np.float32)


def dist(c: Candidates, rng: MT19937) -> int:
    """Draw one candidate with probability softmax(logits), llama.cpp's way."""
    finite = c.logits
    mx = finite.max()
    w = np.exp((finite - mx).astype(np.float32)).astype(np.float64)
    total = w.sum()
    u = rng.canonical() * total
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, u, side="left"))
    return int(c.ids[min(i, c.ids.size - 1)])


class Sampler:
    """The common sampler chain; ``sample(logits)`` picks a token, ``accept(token)`` records it."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = p = params or SamplingParams()
        seed = p.seed if p.seed != LLAMA_DEFAULT_SEED else random.SystemRandom().getrandbits(32)
        self.seed = seed
        self.rng = MT19937(seed)
        self.history: deque[int] = deque(maxlen=max(p.penalty_last_n, 0) or None)

    def _penalizes(self) -> bool:
        p = self.params
        return p.penalty_last_n != 0 and (p.penalty_repeat != 1.0 or p.penalty_freq != 0.0 or p.penalty_present != 0.0)

    def accept(self, token: int) -> None:
        if self.params.penalty_last_n != 0:
            self.history.append(int(token))

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temp <= 0.0 and not self._penalizes():
            # the chain ends in "keep the first maximum": truncations before it cannot change that
            return greedy(logits)
        c = Candidates(logits)
        penalties(c, self.history, p)
        top_k(c, p.top_k)
        typical(c, p.typ_p, p.min_keep)
        top_p(c, p.top_p, p.min_keep)
        min_p(c, p.min_p, p.min_keep)
        temperature(c, p.temp)
        return dist(c, self.rng)


def greedy(logits: np.ndarray) -> int:
    """llama_sampler_init_greedy: the first index with the maximum logit."""
    return int(np.argmax(logits))
