"""pyggml's samplers against llama.cpp's (tests/data/sampling/reference.npz, made by make_sampling_reference.py
beside it from libllama's llama_sampler_init_* on the same logits): logit bias, DRY, top-n-sigma, XTC,
typical, mirostat v1/v2, the default chain with every sampler on, and a custom order. After every
sampler the candidates are the same tokens in the same order with the same logits (float32 round-off),
the final probabilities agree, and with the same seed the same token is drawn, step after step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyggml.llm import samplers as ext
from pyggml.llm.sampling import Candidates, Sampler, SamplingParams, dist, temperature

REF = Path(__file__).resolve().parents[1] / "data" / "sampling" / "reference.npz"
_NAMES = {"typical": "typ_p", "temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
          "xtc": "xtc", "top_n_sigma": "top_n_sigma", "dry": "dry", "penalties": "penalties"}


@pytest.fixture(scope="module")
def ref() -> Any:
    return np.load(REF)


@pytest.fixture(scope="module")
def vocab(tiny_chat_path) -> Any:
    from pyggml.gguf import GGUFReader
    from pyggml.llm.tokenizer import Vocab

    with GGUFReader(tiny_chat_path) as r:
        return Vocab.from_metadata(r)


def params_of(stages: list[list[Any]], breakers: list[str]) -> SamplingParams:
    """The case's llama.cpp sampler chain as pyggml's SamplingParams (samplers in the same order)."""
    kw: dict[str, Any] = {"samplers": tuple(_NAMES[k] for k, *_ in stages if k in _NAMES), "min_keep": 0,
                          "dry_sequence_breakers": tuple(breakers)}
    for kind, *a in stages:
        if kind == "logit_bias":
            kw["logit_bias"] = tuple((int(t), float(b)) for t, b in a[0])
        elif kind == "penalties":
            kw.update(penalty_last_n=a[0], penalty_repeat=a[1], penalty_freq=a[2], penalty_present=a[3])
        elif kind == "dry":
            kw.update(dry_multiplier=a[0], dry_base=a[1], dry_allowed_length=a[2], dry_penalty_last_n=a[3])
        elif kind == "top_n_sigma":
            kw["top_n_sigma"] = a[0]
        elif kind == "top_k":
            kw["top_k"] = a[0]
        elif kind == "typical":
            kw.update(typ_p=a[0], min_keep=a[1])
        elif kind in ("top_p", "min_p"):
            kw.update({kind: a[0], "min_keep": a[1]})
        elif kind == "xtc":
            kw.update(xtc_probability=a[0], xtc_threshold=a[1], min_keep=a[2], seed=a[3])
        elif kind == "temp":
            kw["temp"] = a[0]
        elif kind == "dist":
            kw["seed"] = a[0]
        elif kind in ("mirostat", "mirostat_v2"):
            kw.update(mirostat=1 if kind == "mirostat" else 2, mirostat_tau=a[0], mirostat_eta=a[1], seed=1234)
    return SamplingParams(**kw)


def _same(c: Candidates, ref: Any, key: str, where: str) -> None:
    ids, logits = ref[f"{key}/ids"], ref[f"{key}/logits"]
    assert c.ids.tolist() == ids.tolist(), f"{where}: candidates differ"
    np.testing.assert_allclose(c.logits, logits, rtol=2e-6, atol=2e-6, err_msg=where)


CASES = ["logit_bias", "dry", "dry_skip", "top_n_sigma", "xtc", "typical", "mirostat1", "mirostat2", "full_chain",
         "custom_order"]


@pytest.mark.parametrize("name", CASES)
def test_each_sampler_keeps_what_llama_cpp_keeps(ref: Any, vocab: Any, name: str) -> None:
    steps, history, stages = json.loads(str(ref["cases"]))[name]
    sampler = Sampler(params_of(stages, json.loads(str(ref["breakers"]))), vocab)
    whole = Sampler(sampler.params, vocab)  # the same chain through sample(), for the tokens alone
    for t in history:
        sampler.accept(t)
        whole.accept(t)
    for step in range(steps):
        key = f"{name}/{step}"
        logits = ref[f"{key}/logits"]
        c = Candidates(logits)
        j = 0
        if stages[0][0] == "logit_bias":
            ext.logit_bias(c, sampler.params.logit_bias)
            _same(c, ref, f"{key}/stage0", f"{key} logit_bias")
            j = 1
        if sampler.mirostat is not None:
            temperature(c, sampler.params.temp)
            _same(c, ref, f"{key}/stage{j}", f"{key} temp")
            token = sampler.mirostat.sample(c)
        else:
            for stage in sampler.stages:
                stage(c)
                _same(c, ref, f"{key}/stage{j}", f"{key} {stages[j][0]}")
                j += 1
            token = dist(c, sampler.rng)
        assert token == int(ref[f"{key}/token"][0]) and c.selected == int(ref[f"{key}/selected"][0]), key
        assert c.p is not None
        np.testing.assert_allclose(c.p, ref[f"{key}/p"], rtol=1e-5, atol=1e-7, err_msg=f"{key} probabilities")
        assert whole.sample(logits) == token
        sampler.accept(token)
        whole.accept(token)


def test_reference_cases_exercise_the_samplers(ref: Any) -> None:
    """The data is worth checking against: each sampler changed the candidates in some step."""
    cases = json.loads(str(ref["cases"]))

    def changed(name: str, j: int) -> bool:
        for step in range(cases[name][0]):
            before = ref[f"{name}/{step}/logits"] if j == 0 else ref[f"{name}/{step}/stage{j - 1}/logits"]
            after = ref[f"{name}/{step}/stage{j}/logits"]
            if before.shape != after.shape or not np.array_equal(before, after):
                return True
        return False

    assert changed("logit_bias", 0) and changed("dry", 0) and changed("top_n_sigma", 0) and changed("xtc", 1)
    assert changed("typical", 0) and changed("custom_order", 1) and changed("custom_order", 2)
    full = [k for k, *_ in cases["full_chain"][2]]
    assert all(changed("full_chain", j) for j in range(len(full) - 1)), full
    xtc_hit = [ref[f"xtc/{s}/stage1/ids"].size < ref[f"xtc/{s}/stage0/ids"].size for s in range(8)]
    assert any(xtc_hit) and not all(xtc_hit)  # its own RNG both fired and held off
    toks = {int(ref[f"mirostat2/{s}/token"][0]) for s in range(8)}
    assert len(toks) > 1
