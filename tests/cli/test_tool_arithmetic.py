"""The tools' arithmetic: perplexity's compiled log-softmax scoring, the bench tools' rand() stream."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.cli.perplexity import neg_log_probs


def _reference(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    return np.log(np.exp(x - mx).sum(axis=1)) - (x[np.arange(len(x)), t] - mx[:, 0])


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_selected_rows_match_a_float64_log_softmax(n_threads: int) -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((9, 1000)) * 4).astype(np.float32)
    rows = np.array([8, 1, 4, 5, 2])
    targets = rng.integers(0, 1000, len(rows))
    got = neg_log_probs(logits, targets, rows, n_threads)
    np.testing.assert_allclose(got, _reference(logits[rows], targets), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, neg_log_probs(logits[rows], targets))  # the same bits, threads or not


def test_targets_outside_the_vocabulary_or_miscounted_are_refused() -> None:
    logits = np.zeros((2, 10), dtype=np.float32)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        neg_log_probs(logits, [3, 10])
    with pytest.raises(ValueError, match="1 targets for 2 rows"):
        neg_log_probs(logits, [3])


def test_bench_tokens_are_glibc_rand_values() -> None:
    """llama-bench and llama-batched-bench draw tokens from rand() after srand(1); the stream here must give
    the C library's values (checked against this machine's libc where it is glibc)."""
    import ctypes
    import ctypes.util
    import itertools

    from pyggml.cli.bench import glibc_rand, glibc_rand_stream

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        pytest.skip("the C library here is not glibc")
    for seed in (1, 12345):
        libc.srand(seed)
        want = [libc.rand() for _ in range(2000)]
        assert glibc_rand(2000, seed) == want
        assert list(itertools.islice(glibc_rand_stream(seed), 2000)) == want
