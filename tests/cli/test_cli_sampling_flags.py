"""llama.cpp's sampling flags (common/arg.cpp) on generate/chat/batched/serve: names, defaults, parsing."""

from __future__ import annotations

import math

import pytest

from pyggml.cli.common import sampling_params_from_args
from pyggml.cli.errors import CLIError
from pyggml.cli.main import build_parser
from pyggml.llm.sampling import DEFAULT_SAMPLERS, SamplingParams


def _params(*flags: str, command: str = "generate") -> SamplingParams:
    prompt = [] if command == "serve" else ["-p", "hi"]
    args = build_parser().parse_args([command, "-m", "x.gguf", *prompt, *flags])
    return sampling_params_from_args(args, 1000)


@pytest.mark.parametrize("command", ["generate", "chat", "batched", "serve"])
def test_defaults_are_llama_cpp_s(command: str) -> None:
    p = _params(command=command)
    assert p.samplers == DEFAULT_SAMPLERS == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                                              "xtc", "temperature")
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*") and (p.xtc_probability, p.xtc_threshold) == (0.0, 0.1)
    assert (p.mirostat, p.mirostat_eta, p.mirostat_tau, p.top_n_sigma, p.typ_p) == (0, 0.1, 5.0, -1.0, 1.0)
    assert p.logit_bias == ()


def test_flags_reach_the_params() -> None:
    p = _params("--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n",
                "128", "--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "###", "--xtc-probability", "0.5",
                "--xtc-threshold", "0.2", "--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "4",
                "--top-nsigma", "1.5", "--typical", "0.9", "-l", "15+1", "--logit-bias", "2-inf", "-l", "7-0.5",
                "--presence-penalty", "0.3", "--frequency-penalty", "0.2", "--samplers", "top_k;Temperature;min-p")
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.8, 2.0, 3, 128)
    assert p.dry_sequence_breakers == ("\n", "###") and (p.xtc_probability, p.xtc_threshold) == (0.5, 0.2)
    assert (p.mirostat, p.mirostat_eta, p.mirostat_tau, p.top_n_sigma, p.typ_p) == (2, 0.2, 4.0, 1.5, 0.9)
    assert p.logit_bias == ((15, 1.0), (2, -math.inf), (7, -0.5))
    assert (p.penalty_present, p.penalty_freq) == (0.3, 0.2)
    assert p.samplers == ("top_k", "temperature", "min_p")
    assert _params("--sampling-seq", "kmt").samplers == ("top_k", "min_p", "temperature")
    assert _params("--dry-sequence-breaker", "none").dry_sequence_breakers == ()
    assert _params("--dry-base", "0.5").dry_base == 1.75  # llama.cpp ignores a base below 1


@pytest.mark.parametrize(("flags", "says"), [
    (["-l", "15*1"], "TOKEN_ID+BIAS"), (["-l", "abc+1"], "TOKEN_ID+BIAS"), (["--samplers", "top_k;nope"], "nope"),
    (["--sampling-seq", "kz"], "'z'"), (["--samplers", "infill"], "not supported"),
])
def test_bad_flags_are_named(flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "-m", "x.gguf", *flags])
    assert says in capsys.readouterr().err


def test_logit_bias_token_outside_the_vocabulary() -> None:
    with pytest.raises(CLIError, match="token 5000 is not in the vocabulary"):
        _params("-l", "5000+1")
