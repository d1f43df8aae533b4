"""Every sub-command, every flag that takes a value, given bad values: a clean error or nothing.

The walk runs ``pyggml CMD FLAG VALUE`` for each flag with negative, zero, huge, non-numeric and
NaN values, a missing file and a directory. A run either gets past the flag checks (it would now load
a model, start a server...: the test stops it there, see ``stop_before_work``) or ends with exit
status 1 or 2, exactly one ``error:`` line on stderr and no traceback. A table of values each flag
must refuse makes the test fail when a check goes missing.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from pyggml.cli.main import build_parser, main

VALUES = ["-5", "0", "99999999999999999999", "abc", "nan", "/nonexistent/file.gguf", "DIR"]


class _Reached(Exception):
    """The command accepted its flags and got to its real work."""


def _stop(*args: object, **kwargs: object) -> None:
    raise _Reached


@pytest.fixture
def stop_before_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the commands call once their flags are accepted raises _Reached instead."""
    from pyggml.gguf.reader import GGUFReader
    from pyggml.llm.model import Model
    from pyggml.llm.tokenizer import Vocab
    from pyggml.rpc.server import RPCServer

    monkeypatch.setattr(Model, "__init__", _stop)
    monkeypatch.setattr(Vocab, "from_gguf", _stop)
    monkeypatch.setattr(GGUFReader, "__init__", _stop)
    monkeypatch.setattr(RPCServer, "__init__", _stop)
    monkeypatch.setattr("pyggml.rpc.client.parse_rpc_servers", _stop)
    monkeypatch.setattr("pyggml.cli.common.parse_rpc_servers", _stop)  # the commands' own bindings
    monkeypatch.setattr("pyggml.cli.devices.parse_rpc_servers", _stop)


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _value_flags(p: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in p._actions
            if a.option_strings and a.nargs is None and a.const is None and not isinstance(
                a, argparse._HelpAction | argparse._VersionAction | argparse._StoreTrueAction)]


def _required(cmd: str, text: Path) -> list[str]:
    return {"generate": ["-p", "hi"], "tokenize": ["-p", "hi"], "perplexity": ["-f", str(text)],
            "dump": [str(text)]}.get(cmd, [])


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int | None, str]:
    """(exit status, stderr), or (None, "") when the command got past its checks."""
    try:
        rc = main(argv)
    except _Reached:
        capsys.readouterr()
        return None, ""
    except SystemExit as e:  # argparse
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


def _assert_clean(argv: list[str], rc: int | None, err: str) -> None:
    if rc is None:
        return
    assert rc in (1, 2), (argv, rc, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, (argv, err)
    assert "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("cmd", sorted(_commands()))
def test_every_flag_takes_bad_values_cleanly(cmd: str, tmp_path: Path, stop_before_work: None,
                                             capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "text.txt"
    text.write_text("some text " * 50)
    flags: list[str | None] = list(_value_flags(_commands()[cmd]))
    if cmd == "dump":
        flags.append(None)  # its FILE argument
    assert flags or cmd == "devices"
    for flag in flags:
        for value in VALUES:
            v = str(tmp_path) if value == "DIR" else value
            argv = [cmd, v] if flag is None else [cmd, *_required(cmd, text), flag, v]
            _assert_clean(argv, *_run(argv, capsys))


MUST_REFUSE = [
    ("generate", "-n", "-5"), ("generate", "-c", "-1"), ("generate", "-c", "99999999999"), ("generate", "-b", "0"),
    ("generate", "-ub", "0"), ("generate", "-t", "-1"), ("generate", "-ngl", "-2"), ("generate", "--keep", "-3"),
    ("generate", "--temp", "nan"), ("generate", "--top-p", "1.5"), ("generate", "--min-p", "-0.1"),
    ("generate", "--top-k", "-1"), ("generate", "--repeat-penalty", "0"), ("generate", "-s", "-2"),
    ("generate", "-n", "abc"), ("generate", "-m", "DIR"), ("generate", "-m", "/nonexistent/file.gguf"),
    ("generate", "-fa", "maybe"), ("chat", "-n", "-2"), ("bench", "-r", "0"), ("bench", "-p", "-3"),
    ("bench", "-n", "x"), ("bench", "-o", "csv"), ("perplexity", "--chunks", "-5"), ("perplexity", "-f", "DIR"),
    ("rpc-server", "-p", "70000"), ("rpc-server", "-p", "0"), ("rpc-server", "-t", "-1"), ("rpc-server", "-m", "-1"),
    ("tokenize", "-m", "DIR"), ("dump", None, "DIR"), ("dump", None, "/nonexistent/file.gguf"),
]


@pytest.mark.parametrize(("cmd", "flag", "value"), MUST_REFUSE)
def test_bad_values_are_refused_before_any_work(cmd: str, flag: str | None, value: str, tmp_path: Path,
                                                stop_before_work: None, capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "text.txt"
    text.write_text("some text " * 50)
    v = str(tmp_path) if value == "DIR" else value
    req = [] if cmd == "dump" else _required(cmd, text)
    if flag == "-f":
        req = []
    argv = [cmd, *req, *([flag] if flag else []), v]
    rc, err = _run(argv, capsys)
    assert rc is not None, f"{argv} was accepted"
    _assert_clean(argv, rc, err)


def test_an_unreadable_model_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    f.chmod(0)
    if os.access(f, os.R_OK):  # root reads every file: make the check see it as the file's owner would
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(f) else real(p, mode))
    rc, err = _run(["generate", "-p", "hi", "-m", str(f)], capsys)
    assert rc == 1 and err.strip() == f"error: -m/--model: {f} is not readable (permission denied)"
