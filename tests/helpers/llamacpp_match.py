"""The comparison every architecture's test makes against llama.cpp's kept outputs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def assert_logits_and_greedy(ctx: object, tokens: Sequence[int], ref_logits: np.ndarray, ref_greedy: np.ndarray,
                             label: str, top1_margin: float | None = 1e-3) -> None:
    """Decode ``tokens`` with every position an output: cosine >= 0.9999 per position against llama.cpp's logits,
    the same top-1 (where llama.cpp's top two are more than ``top1_margin`` apart; None: at every position), then
    the same greedy tokens, decoded one at a time."""
    out = ctx.decode(list(tokens), outputs=[True] * len(tokens))  # type: ignore[attr-defined]
    cos = (out * ref_logits).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref_logits, axis=1))
    assert cos.min() >= 0.9999, f"{label}: cosine per position {np.round(cos, 6)}"
    if top1_margin is None:
        assert np.array_equal(out.argmax(1), ref_logits.argmax(1)), f"{label}: top-1 differs"
    else:
        top2 = np.sort(ref_logits, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > top1_margin
        assert np.array_equal(out.argmax(1)[clear], ref_logits.argmax(1)[clear]), f"{label}: top-1 differs"
    greedy, last = [], out[-1]
    for _ in range(len(ref_greedy)):
        t = int(np.argmax(last))
        greedy.append(t)
        last = ctx.decode([t])[0]  # type: ignore[attr-defined]
    assert greedy == ref_greedy.tolist()
