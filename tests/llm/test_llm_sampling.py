"""The sampler chain: llama.cpp's truncation rules, greedy at temp 0, std::mt19937 draws."""

import numpy as np
import pytest

from pyggml.llm.sampling import MT19937, Candidates, Sampler, SamplingParams, min_p, top_k, top_p


def test_mt19937_matches_std():
    # the C++ standard fixes the 10000th output of a default-seeded (5489) std::mt19937: 4123659995
    r = MT19937(5489)
    for _ in range(9999):
        r.next_u32()
    assert r.next_u32() == 4123659995


def test_canonical_uses_two_draws():
    a, b = MT19937(42), MT19937(42)
    u = a.canonical()
    r1, r2 = b.next_u32(), b.next_u32()
    assert u == (r1 + r2 * 2.0**32) / 2.0**64 and 0.0 <= u < 1.0


def test_top_k_keeps_k_sorted():
    c = Candidates(np.array([0.1, 3.0, 2.0, -1.0, 2.5], dtype=np.float32))
    top_k(c, 3)
    assert list(c.ids) == [1, 4, 2] and c.sorted


def test_top_p_keeps_until_cumulative_reaches_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    c = Candidates(logits)
    top_p(c, 0.8, 1)  # 0.5 + 0.3 reaches 0.8 (within float rounding) at the second token
    assert list(c.ids) in ([0, 1], [0, 1, 2])
    c = Candidates(logits)
    top_p(c, 0.79, 1)
    assert list(c.ids) == [0, 1]


def test_min_p_threshold_relative_to_best():
    logits = np.log(np.array([0.6, 0.2, 0.04, 0.01], dtype=np.float32))
    c = Candidates(logits)
    min_p(c, 0.05, 1)  # keep p >= 0.05 * 0.6 = 0.03
    assert list(c.ids) == [0, 1, 2]


def test_temp_zero_is_greedy_first_maximum():
    logits = np.array([1.0, 5.0, 5.0, 2.0], dtype=np.float32)
    s = Sampler(SamplingParams(temp=0.0, seed=1))
    assert all(s.sample(logits) == 1 for _ in range(5))


def test_seed_reproducible_and_distribution_follows_softmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=8).astype(np.float32)
    params = SamplingParams(seed=1234, top_k=0, top_p=1.0, min_p=0.0, temp=1.0)
    a = [Sampler(params).sample(logits) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same first draw
    s = Sampler(params)
    draws = np.bincount([s.sample(logits) for _ in range(4000)], minlength=8) / 4000
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert np.abs(draws - p).max() < 0.03


def test_repeat_penalty_lowers_seen_tokens():
    logits = np.array([2.0, 1.9], dtype=np.float32)
    s = Sampler(SamplingParams(temp=0.0, penalty_repeat=1.5, seed=0))
    assert s.sample(logits) == 0
    s.accept(0)
    assert s.sample(logits) == 1


@pytest.mark.parametrize("k", [1, 2])
def test_chain_with_top_k_only_samples_from_top(k):
    logits = np.array([0.0, 10.0, 9.0, -5.0], dtype=np.float32)
    s = Sampler(SamplingParams(seed=7, top_k=k, top_p=1.0, min_p=0.0, temp=5.0))
    allowed = {1} if k == 1 else {1, 2}
    assert {s.sample(logits) for _ in range(50)} <= allowed


F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("kw", [
    {"dry_multiplier": F32_MAX, "dry_base": F32_MAX, "dry_sequence_breakers": ()},
    {"top_n_sigma": F32_MAX}, {"mirostat": 1, "mirostat_tau": F32_MAX, "mirostat_eta": F32_MAX},
    {"mirostat": 2, "mirostat_tau": -F32_MAX, "mirostat_eta": F32_MAX}, {"temp": F32_MAX},
    {"penalty_repeat": F32_MAX, "penalty_freq": -F32_MAX, "penalty_present": F32_MAX},
    {"logit_bias": ((1, F32_MAX), (2, F32_MAX))}, {"typ_p": 0.5, "temp": 1e-30},
])
def test_extreme_parameters_sample_without_numpy_warnings(kw):
    """Values at float32's limits (what the server clamps huge ones to) overflow silently, as in C."""
    import warnings

    logits = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    s = Sampler(SamplingParams(seed=1, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in [1, 2, 3, 1, 2, 3, 1, 2]:
            s.accept(t)
        for _ in range(3):
            t = s.sample(logits)
            assert 0 <= t < 64
            s.accept(t)
