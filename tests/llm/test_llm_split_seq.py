"""llm.batch.split_seq: llama_batch_allocr::split_seq's ubatches (the split of recurrent memories)."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.llm.batch import Batch, PreparedBatch, prepare, split_seq


def _batch(seq_sets: list[list[int]]) -> PreparedBatch:
    """A batch with these sequence sets (the split reads only the sets; positions are not its concern)."""
    n = len(seq_sets)
    masks = np.array([sum(1 << s for s in ss) for ss in seq_sets], dtype=np.uint64)
    return PreparedBatch(np.arange(n, dtype=np.int32), None, np.arange(n, dtype=np.int64), masks,
                         np.array([min(ss) for ss in seq_sets], dtype=np.int64), np.ones(n, dtype=bool),
                         sorted({s for ss in seq_sets for s in ss}))


@pytest.mark.parametrize(("seq_sets", "n_ubatch", "want"), [
    # sequence 0's tokens, then sequence 1's, then the token both share (not a subset of {0} or {1})
    ([[0], [1], [0], [0, 1], [1]], 10, [[0, 2], [1, 4], [3]]),
    # a shared token first: its sequences' tokens follow it while each is a subset of the last taken
    ([[0, 1], [0], [1], [0]], 10, [[0, 1, 3], [2]]),
    # n_ubatch cuts a run
    ([[0, 1], [0], [1], [0]], 2, [[0, 1], [2], [3]]),
    ([[2]] * 5, 2, [[0, 1], [2, 3], [4]]),
])
def test_split_seq_follows_llama_cpp(seq_sets: list[list[int]], n_ubatch: int, want: list[list[int]]) -> None:
    ubs = split_seq(_batch(seq_sets), n_ubatch)
    assert [ub.index.tolist() for ub in ubs] == want
    assert all(ub.n_seqs == 1 for ub in ubs)


def test_split_seq_of_a_checked_batch() -> None:
    """A shared prompt (sequences 0 and 1, positions 0-2), then each sequence's own token: the prompt first,
    then sequence 0's token, then sequence 1's."""
    b = prepare(Batch(token=[5, 6, 7, 8, 9], pos=[0, 1, 2, 3, 3], seq_id=[[0, 1]] * 3 + [[0], [1]]), 100, 8, 2,
                lambda s: -1, lambda s: -1)
    assert [ub.index.tolist() for ub in split_seq(b, 512)] == [[0, 1, 2, 3], [4]]
