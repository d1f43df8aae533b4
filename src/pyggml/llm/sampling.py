"""llama.cpp's sampler chain (common/sampling.cpp, src/llama-sampler.cpp).

The chain is common_sampler_init's: logit bias first (when any), then with mirostat off the samplers
of ``samplers`` in order, by default llama.cpp's penalties -> dry -> top_n_sigma -> top_k ->
typ_p -> top_p -> min_p -> xtc -> temperature, then dist(seed); with mirostat 1 or 2 only
temperature -> mirostat. Samplers whose parameters make them no-ops change nothing, as in
llama.cpp; temperature <= 0 keeps only the first maximum, so ``--temp 0`` is greedy. ``dist``
draws from ``std::mt19937(seed)`` through libstdc++'s ``generate_canonical<double, 53>`` (two 32-bit
outputs), so a seed picks the same token as llama.cpp given the same logits; XTC and mirostat draw
from RNGs of their own, seeded alike, as theirs are. DRY, XTC, top-n-sigma and mirostat live in
:mod:`.samplers`.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import samplers as _ext
from .samplers import top_k

if TYPE_CHECKING:
    from .grammar import GrammarSampler

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

#: llama.cpp's sampler names (common_sampler_type_to_str), their one-letter codes for --sampling-seq,
#: and the default order (common_params_sampling::samplers)
SAMPLER_CHARS = {"dry": "d", "top_k": "k", "typ_p": "y", "top_p": "p", "top_n_sigma": "s", "min_p": "m",
                 "temperature": "t", "xtc": "x", "infill": "i", "penalties": "e", "adaptive_p": "a"}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULT_DRY_BREAKERS = ("\n", ":", "\"", "*")
_UNSUPPORTED = {"infill": "the infill sampler (fill-in-the-middle)", "adaptive_p": "the adaptive-p sampler"}


def _sampler_aliases() -> dict[str, str]:
    """Every spelling common_sampler_types_from_names accepts: canonical, kebab-case, without
    underscores, and nucleus/temp/typ."""
    out = {}
    for name in SAMPLER_CHARS:
        out[name] = name
        if "_" in name:
            out[name.replace("_", "-")] = name
            out[name.replace("_", "")] = name
    out.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"})
    return out


_ALIASES = _sampler_aliases()


def samplers_from_names(names: Sequence[str]) -> tuple[str, ...]:
    """--samplers / the server's ``samplers`` list: llama.cpp's names (case-insensitive, any alias);
    an unknown name, or a sampler pyggml lacks, is a ValueError naming it (llama.cpp skips it)."""
    out = []
    for raw in names:
        name = _ALIASES.get(raw.strip().lower())
        if name is None:
            known = ", ".join(SAMPLER_CHARS)
            raise ValueError(f"unknown sampler {raw!r} (llama.cpp's names: {known})")
        out.append(_supported(name))
    return tuple(out)


def samplers_from_chars(chars: str) -> tuple[str, ...]:
    """--sampling-seq: one letter a sampler (``edskypmxt`` is the default order)."""
    by_char = {c: n for n, c in SAMPLER_CHARS.items()}
    out = []
    for ch in chars:
        if ch not in by_char:
            raise ValueError(f"unknown sampler letter {ch!r} in {chars!r} (letters: {''.join(by_char)})")
        out.append(_supported(by_char[ch]))
    return tuple(out)


def _supported(name: str) -> str:
    if name in _UNSUPPORTED:
        raise ValueError(f"sampler {name!r} ({_UNSUPPORTED[name]}) is not supported by pyggml")
    return name


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
    # llama.cpp's other samplers (common.h's defaults: all off)
    top_n_sigma: float = -1.0  # <= 0: off
    xtc_probability: float = 0.0  # 0: off
    xtc_threshold: float = 0.1  # > 0.5: off
    dry_multiplier: float = 0.0  # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # 0: off
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0  # 0: off, 1: mirostat, 2: mirostat 2.0 (replaces the samplers below but temperature)
    mirostat_tau: float = 5.0  # target entropy (--mirostat-ent)
    mirostat_eta: float = 0.1  # learning rate (--mirostat-lr)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) pairs; -inf bans a token
    samplers: tuple[str, ...] = field(default=DEFAULT_SAMPLERS)


class Candidates:
    """llama_token_data_array: ids and logits, possibly sorted by descending logit."""

    __slots__ = ("ids", "logits", "p", "selected", "sorted")

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = np.array(logits, dtype=np.float32).reshape(-1)
        self.ids = np.arange(self.logits.size, dtype=np.int64)
        self.p: np.ndarray | None = None  # the probabilities of the last softmax (llama_token_data.p)
        self.selected = -1
        self.sorted = False

    def sort(self) -> None:
        if not self.sorted:
            order = np.argsort(-self.logits, kind="stable")
            self.ids, self.logits = self.ids[order], self.logits[order]
            if self.p is not None:
                self.p = self.p[order]
            self.sorted = True

    def keep(self, n: int) -> None:
        self.ids, self.logits = self.ids[:n], self.logits[:n]
        if self.p is not None:
            self.p = self.p[:n]

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

    def canonical_f32(self) -> np.float32:
        """std::uniform_real_distribution<float>(0, 1): generate_canonical<float, 24>, one draw, in float."""
        u = np.float32(self.next_u32()) / np.float32(4294967296.0)
        return u if u < 1.0 else np.nextafter(np.float32(1.0), np.float32(0.0))


def penalties(c: Candidates, history: deque[int], p: SamplingParams) -> None:
    """llama_sampler_penalties: repeat, frequency and presence penalties on the tokens of ``history``."""
    if p.penalty_last_n == 0 or (p.penalty_repeat == 1.0 and p.penalty_freq == 0.0 and p.penalty_present == 0.0):
        return
    counts = Counter(history)
    if not counts:
        return
    toks = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    idx = _positions(c, toks)
    found = idx >= 0
    idx, n = idx[found], n[found]
    f32 = np.float32
    with np.errstate(over="ignore"):  # huge penalties overflow to -inf in float32, as in llama.cpp
        v = c.logits[idx]
        v = np.where(v <= 0, v * f32(p.penalty_repeat), v / f32(p.penalty_repeat)).astype(f32)
        c.logits[idx] = v - (n * f32(p.penalty_freq) + f32(1.0) * f32(p.penalty_present)).astype(f32)
    c.sorted = False


def _positions(c: Candidates, toks: np.ndarray) -> np.ndarray:
    """Where each token of ``toks`` is among the candidates (-1: not there). Candidates still in
    vocabulary order are indexed directly, as llama.cpp's samplers do; others are searched."""
    size = c.ids.size
    inside = (toks >= 0) & (toks < size)
    idx = np.where(inside, toks, 0)
    direct = inside & (c.ids[idx] == toks) if size else inside
    if direct.all():
        return idx
    where = {int(t): i for i, t in enumerate(c.ids.tolist())}
    return np.array([i if d else where.get(int(t), -1) for i, d, t in zip(idx.tolist(), direct, toks.tolist(),
                                                                           strict=True)], dtype=np.int64)


def typical(c: Candidates, p: float, min_keep: int) -> None:
    """llama_sampler_typical: keep the tokens whose surprise is closest to the entropy, up to mass ``p``."""
    if p >= 1.0:
        return
    probs = _ext.softmax(c, True)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs, dtype=np.float32)
        ent = np.add.accumulate((-probs * logp).astype(np.float32), dtype=np.float32)[-1]
        shifted = np.abs((-logp - ent).astype(np.float32))
    order = np.argsort(shifted, kind="stable")
    cum = np.add.accumulate(probs[order], dtype=np.float32)
    last = c.ids.size
    for i in range(c.ids.size):
        if cum[i] > np.float32(p) and i + 1 >= min_keep:
            last = i + 1
            break
    sel = order[:last]
    c.ids, c.logits, c.p = c.ids[sel], c.logits[sel], probs[sel]
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
    """llama_sampler_min_p: keep the tokens with p >= p_max * ``p`` (unsorted candidates keep their order)."""
    if p <= 0.0 or c.ids.size == 0:
        return
    if not c.sorted:
        threshold = c.logits.max() + np.float32(math.log(p))
        mask = c.logits >= threshold
        n = int(np.count_nonzero(mask))
        if n and n >= min_keep:
            c.ids, c.logits = c.ids[mask], c.logits[mask]
            if c.p is not None:
                c.p = c.p[mask]
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
    i = min(int(np.searchsorted(cum, u, side="left")), c.ids.size - 1)
    c.p, c.selected = (w / total).astype(np.float32), i
    return int(c.ids[i])


Stage = Callable[[Candidates], None]


def dry_enabled(p: SamplingParams) -> bool:
    """llama_sampler_init_dry's test: otherwise DRY is an empty sampler."""
    return p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and p.dry_penalty_last_n > 0


class Sampler:
    """The common sampler chain; ``sample(logits)`` picks a token, ``accept(token)`` records it.

    ``vocab`` is needed only for DRY's sequence breakers (their tokens) and mirostat's vocabulary size;
    ``dry_breakers``, the breakers already tokenized (samplers.dry_breakers), spares the vocabulary scan.
    ``grammar`` (llama.cpp's grmr) is kept apart from the chain: see sample()."""

    def __init__(self, params: SamplingParams | None = None, vocab: Any = None,
                 dry_breakers: dict[int, list[tuple[int, ...]]] | None = None,
                 grammar: GrammarSampler | None = None) -> None:
        self.params = p = params or SamplingParams()
        self.grammar = grammar
        self.seed = self._seed()
        self.rng = MT19937(self.seed)
        self.history: deque[int] = deque(maxlen=max(p.penalty_last_n, 0) or None)
        self.dry = self._make_dry(vocab, dry_breakers)
        self.xtc_rng = MT19937(self._seed())
        self.mirostat = None
        if p.mirostat:  # without the vocabulary, the logits' length is its size
            n_vocab = vocab.n_tokens if vocab is not None else 0
            self.mirostat = _ext.Mirostat(p.mirostat, n_vocab, p.mirostat_tau, p.mirostat_eta, MT19937(self._seed()))
        self.stages: list[Stage] = [self._stage(name) for name in p.samplers]
        self._greedy_only = self._greedy()

    def _seed(self) -> int:
        """The seed, or (LLAMA_DEFAULT_SEED) a random one: every RNG of the chain gets its own then, as
        llama.cpp's samplers each call get_rng_seed; a fixed seed seeds all alike."""
        seed = self.params.seed
        return seed if seed != LLAMA_DEFAULT_SEED else random.SystemRandom().getrandbits(32)

    def _make_dry(self, vocab: Any, breakers: dict[int, list[tuple[int, ...]]] | None) -> _ext.Dry | None:
        p = self.params
        if not dry_enabled(p):
            return None
        if breakers is None and p.dry_sequence_breakers:
            if vocab is None:
                raise ValueError("DRY's sequence breakers are strings: the sampler needs the vocabulary to tokenize "
                                 "them (or give dry_sequence_breakers=())")
            breakers = _ext.dry_breakers(vocab, p.dry_sequence_breakers)
        return _ext.Dry(p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n, breakers or {})

    def _stage(self, name: str) -> Stage:
        p = self.params
        stages: dict[str, Stage] = {
            "penalties": lambda c: penalties(c, self.history, p),
            "dry": lambda c: self.dry.apply(c) if self.dry is not None else None,
            "top_n_sigma": lambda c: _ext.top_n_sigma(c, p.top_n_sigma),
            "top_k": lambda c: top_k(c, p.top_k),
            "typ_p": lambda c: typical(c, p.typ_p, p.min_keep),
            "top_p": lambda c: top_p(c, p.top_p, p.min_keep),
            "min_p": lambda c: min_p(c, p.min_p, p.min_keep),
            "xtc": lambda c: _ext.xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, self.xtc_rng),
            "temperature": lambda c: temperature(c, p.temp),
        }
        if name not in stages:
            raise ValueError(f"unknown sampler {name!r} (pyggml's: {', '.join(stages)})")
        return stages[name]

    def _penalizes(self) -> bool:
        p = self.params
        return p.penalty_last_n != 0 and (p.penalty_repeat != 1.0 or p.penalty_freq != 0.0 or p.penalty_present != 0.0)

    def _greedy(self) -> bool:
        """True when the chain must end in the first maximum of the raw logits: temperature <= 0 in the
        chain, and nothing before it that changes logits or drops the best token (a truncation keeps it)."""
        p = self.params
        if p.temp > 0.0 or p.mirostat or p.logit_bias or "temperature" not in p.samplers:
            return False
        changes = {"penalties": self._penalizes(), "dry": self.dry is not None,
                   "xtc": p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5}
        return not any(changes.get(name, False) for name in p.samplers[:p.samplers.index("temperature")])

    def accept(self, token: int, is_generated: bool = True) -> None:
        """Record a token: a prompt token (``is_generated=False``) feeds the chain but not the grammar,
        as common_sampler_accept."""
        if self.grammar is not None and is_generated:
            self.grammar.accept(token)
        if self.params.penalty_last_n != 0:
            self.history.append(int(token))
        if self.dry is not None:
            self.dry.accept(token)

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token. With a grammar, as common_sampler_sample: the chain samples first and
        the grammar checks only that token; if it refuses it, the grammar filters every candidate
        and the chain samples again (a second draw of the RNG, as in llama.cpp)."""
        tok = self._sample_chain(logits)
        g = self.grammar
        if g is None or g.allows(tok):
            return tok
        if self._greedy_only:  # the same token as filtering every candidate, then greedy: see best_allowed
            return g.best_allowed(logits)
        return self._sample_chain(g.apply(logits))

    def _sample_chain(self, logits: np.ndarray) -> int:
        if self._greedy_only:
            return greedy(logits)
        # float32 as in C: extreme parameters overflow to inf (or make NaNs) silently, never a numpy warning
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return self.sample_candidates(Candidates(logits))

    def sample_candidates(self, c: Candidates) -> int:
        """The whole chain on ``c``; afterwards ``c`` holds the last candidates, their probabilities and
        ``c.selected`` (what llama.cpp's token data array holds after llama_sampler_apply)."""
        p = self.params
        _ext.logit_bias(c, p.logit_bias)
        if self.mirostat is not None:
            temperature(c, p.temp)
            if not self.mirostat.n_vocab:
                self.mirostat.n_vocab = c.ids.size
            return self.mirostat.sample(c)
        for stage in self.stages:
            stage(c)
        return dist(c, self.rng)


def greedy(logits: np.ndarray) -> int:
    """llama_sampler_init_greedy: the first index with the maximum logit."""
    return int(np.argmax(logits))
