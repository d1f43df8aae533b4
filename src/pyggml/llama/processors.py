"""llama-cpp-python's logits processors and stopping criteria: callables over (input_ids, scores), in lists
that apply them in order. A leaf module, so the chat formats and the Llama class both take them from here."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list):
    """Logits processors applied in order: each gets (input_ids, scores) and returns new scores."""

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Stopping criteria: generation stops when any returns True for (input_ids, logits)."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbid EOS until ``min_tokens`` tokens have been generated (counted from the first call's input)."""

    def __init__(self, min_tokens: int, token_eos: int) -> None:
        self.min_tokens, self.token_eos = min_tokens, token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores
