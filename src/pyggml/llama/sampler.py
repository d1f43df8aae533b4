"""The sampler chain of llama-cpp-python's ``Llama`` (``Llama._init_sampler``), over pyggml's samplers.

llama-cpp-python does not use llama.cpp's common sampler: it builds its own chain per ``generate``:
the user's logits processors first (``logit_bias`` is one), then the penalties, then the grammar,
which filters every candidate, then either greedy (temperature 0), dist alone (temperature < 0),
mirostat v1/v2, or top-k -> typical -> top-p -> min-p -> temperature -> dist with ``min_keep`` 1.
Only generated tokens are accepted by the chain (the prompt never is), so the penalties see the
tokens of this completion only. Every stage is the llama.cpp sampler of the same name from
:mod:`pyggml.llm.sampling` / :mod:`pyggml.llm.samplers`, so a seed draws what llama.cpp's would.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..llm import samplers as _ext
from ..llm.grammar import GrammarSampler
from ..llm.samplers import top_k
from ..llm.sampling import (
    LLAMA_DEFAULT_SEED,
    MT19937,
    Candidates,
    SamplingParams,
    dist,
    min_p,
    penalties,
    temperature,
    top_p,
    typical,
)

#: what a logits processor is: (input_ids, scores) -> scores, as llama-cpp-python's LogitsProcessor
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class ChainParams:
    """The arguments of ``Llama._init_sampler`` that shape the chain."""

    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    temp: float = 0.80
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    mirostat_mode: int = 0
    mirostat_eta: float = 0.1
    mirostat_tau: float = 5.0


class ChainSampler:
    """One completion's chain: ``sample(logits, input_ids)`` picks a token and accepts it."""

    def __init__(self, p: ChainParams, seed: int, n_vocab: int, last_n: int,
                 logits_processor: LogitsProcessor | None = None, grammar: GrammarSampler | None = None) -> None:
        if p.mirostat_mode not in (0, 1, 2):
            raise ValueError(f"mirostat_mode must be 0, 1 or 2, got {p.mirostat_mode}")
        self.p = p
        self.logits_processor = logits_processor
        self.grammar = grammar
        self.pen = SamplingParams(penalty_last_n=last_n, penalty_repeat=p.repeat_penalty,
                                  penalty_freq=p.frequency_penalty, penalty_present=p.presence_penalty)
        self.history: deque[int] = deque(maxlen=max(last_n, 0) or None)
        # llama_sampler_init_dist / _mirostat: LLAMA_DEFAULT_SEED asks for a random seed
        seed &= 0xFFFFFFFF
        self.rng = MT19937(seed if seed != LLAMA_DEFAULT_SEED else random.SystemRandom().getrandbits(32))
        self.mirostat = None
        if p.temp > 0.0 and p.mirostat_mode:
            self.mirostat = _ext.Mirostat(p.mirostat_mode, n_vocab, p.mirostat_tau, p.mirostat_eta, self.rng)

    def sample(self, logits: np.ndarray, input_ids: np.ndarray) -> int:
        """Run the chain on one row of logits; the chosen token is accepted (penalties, grammar)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            tok = self._choose(np.asarray(logits, dtype=np.float32).reshape(-1), input_ids)
        self.accept(tok)
        return tok

    def _choose(self, logits: np.ndarray, input_ids: np.ndarray) -> int:
        c = Candidates(logits)
        if self.logits_processor is not None:
            out = self.logits_processor(input_ids, c.logits.copy())
            c.logits = np.array(out, dtype=np.float32).reshape(-1)
            if c.logits.size != c.ids.size:
                raise ValueError(f"a logits processor returned {c.logits.size} scores for a vocabulary of "
                                 f"{c.ids.size}")
        penalties(c, self.history, self.pen)  # leaves the candidates in vocabulary order
        p = self.p
        if self.grammar is not None:
            if p.temp == 0.0:  # greedy: the first maximum among the allowed tokens
                return self.grammar.best_allowed(c.logits)
            c.logits = self.grammar.apply(c.logits)
        if p.temp == 0.0:
            return int(np.argmax(c.logits))  # llama_sampler_greedy: the first maximum
        if p.temp < 0.0:
            return dist(c, self.rng)
        if self.mirostat is not None:
            return self.mirostat.sample(c)
        top_k(c, p.top_k)
        typical(c, p.typical_p, 1)
        top_p(c, p.top_p, 1)
        min_p(c, p.min_p, 1)
        temperature(c, p.temp)
        return dist(c, self.rng)

    def accept(self, token: int) -> None:
        if self.grammar is not None:
            self.grammar.accept(token)
        if self.pen.penalty_last_n != 0:
            self.history.append(int(token))
