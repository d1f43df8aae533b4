"""The server against hostile requests (issue #32, item 3), in-process on the tiny chat model.

Each case was found by attacking a live server: megabytes of text to /tokenize, ten thousand stop
strings, JSON that breaks the parser, non-finite sampling values, trailing-slash redirects. Every one
must be answered by a JSON error (or served cheaply), never by a 500, a redirect or minutes of CPU.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from helpers.serve_util import in_process_server


@pytest.fixture(scope="module")
def served(tiny_chat_path) -> Iterator[tuple[TestClient, Any]]:
    with in_process_server(["-m", str(tiny_chat_path), "-c", "1024", "-np", "2", "-t", "1", "-q"]) as served:
        yield served


@pytest.fixture
def client(served: tuple[TestClient, Any]) -> TestClient:
    return served[0]


def _error(r: Any, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert body["error"]["code"] == status
    return body["error"]["message"]


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


def test_tokenize_input_is_bounded_like_a_prompt(client: TestClient, served: tuple[TestClient, Any]) -> None:
    """Text that could never fit a slot is refused from its byte count, before any tokenizing (8 MB of it
    kept a server busy for ~110 s of CPU and 6 GB of memory); text under the bound is served."""
    state = served[1]
    limit = state.max_prompt_bytes
    assert 0 < limit < 100_000
    t0 = time.perf_counter()
    msg = _error(client.post("/tokenize", json={"content": "word " * (limit // 5 + 10)}), 400)
    assert "content" in msg and str(limit) in msg
    assert time.perf_counter() - t0 < 2.0
    ok = client.post("/tokenize", json={"content": "hello world"})
    assert ok.status_code == 200 and ok.json()["tokens"]
    msg = _error(client.post("/detokenize", json={"tokens": [1] * (state.engine.n_slot_ctx * 4 + 1)}), 400)
    assert "tokens" in msg


def test_tokenize_work_of_a_client_that_left_is_dropped(served: tuple[TestClient, Any]) -> None:
    """A tokenization waiting its turn whose client has gone is never started."""
    import anyio


    state = served[1]
    calls = []
    real = state.vocab

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def tokenize(self, *a: Any, **k: Any) -> list[int]:
            calls.append(1)
            return real.tokenize(*a, **k)

    async def run() -> int:
        saved = state.vocab
        state.vocab = Counting()
        try:
            await _tokenize_request(state, {"content": "hello"}, lambda: None)  # the body, then the client is gone
        finally:
            state.vocab = saved
        return len(calls)

    assert anyio.run(run) == 0


def test_tokenizing_goes_by_pieces_stops_early_and_stays_exact(served: tuple[TestClient, Any]) -> None:
    """Text is tokenized by growing prefixes: the same tokens as one call when it fits a slot; given up on
    once a prefix has more tokens than a slot holds (never tokenizing the whole); and stopped between two
    pieces when the client goes (the 8 MB texts' clients had left after 3 s, the server worked ~110 s)."""
    from pyggml.serve.tokenwork import FIRST_PREFIX, ClientGone, tokenize_bounded

    vocab = served[1].vocab
    seen: list[int] = []

    class Recording:
        def tokenize(self, text: str, **kw: Any) -> list[int]:
            seen.append(len(text))
            return vocab.tokenize(text, **kw)

    text = "The quick brown fox, naturally, jumps.\n" * (FIRST_PREFIX // 10)
    whole = vocab.tokenize(text, add_special=True, parse_special=True)
    assert tokenize_bounded(Recording(), text, len(whole), lambda: False, True, True) == whole
    assert seen == [FIRST_PREFIX, len(text)]  # a piece, then the whole
    seen.clear()
    assert tokenize_bounded(Recording(), text, 500, lambda: False, True, True) is None
    assert seen == [FIRST_PREFIX]  # the first prefix already has too many tokens
    seen.clear()
    calls = iter([False, True])
    with pytest.raises(ClientGone):
        tokenize_bounded(Recording(), text, len(whole), lambda: next(calls), True, True)
    assert seen == [FIRST_PREFIX]


def test_a_client_leaving_mid_tokenization_stops_it(served: tuple[TestClient, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The server side of the pieces: the disconnect watcher stops the work at its next piece (499)."""
    import threading

    import anyio

    from pyggml.serve import tokenwork

    monkeypatch.setattr(tokenwork, "FIRST_PREFIX", 64)  # pieces on a short text
    state = served[1]
    real, left, calls = state.vocab, threading.Event(), []

    class LeavesDuringWork:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def tokenize(self, *a: Any, **k: Any) -> list[int]:
            calls.append(1)
            left.set()  # the client goes while this piece is tokenized
            time.sleep(0.3)
            return real.tokenize(*a, **k)

    async def until_left() -> None:
        while not left.is_set():
            await anyio.sleep(0.01)

    async def run() -> list[dict]:
        monkeypatch.setattr(state, "vocab", LeavesDuringWork())
        out = await _tokenize_request(state, {"content": "hello world " * 100}, until_left)
        monkeypatch.setattr(state, "vocab", real)
        return out

    out = anyio.run(run)
    assert len(calls) == 1 and out[0]["status"] == 499


def test_stop_list_is_bounded_with_a_400_naming_the_field(client: TestClient) -> None:
    """10,000 stop strings of 400 characters slowed every slot fourfold; now refused, as is one huge string."""
    from pyggml.serve.schemas import MAX_STOP_CHARS, MAX_STOP_WORDS

    msg = _error(client.post("/v1/chat/completions", json={**CHAT, "stop": ["x" * 400] * 10_000}), 400)
    assert "stop" in msg and str(MAX_STOP_WORDS) in msg
    msg = _error(client.post("/v1/completions", json={"prompt": "a", "stop": "y" * (MAX_STOP_CHARS + 1)}), 400)
    assert "stop" in msg and str(MAX_STOP_CHARS) in msg
    r = client.post("/v1/chat/completions", json={**CHAT, "stop": ["z" * MAX_STOP_CHARS] * MAX_STOP_WORDS})
    assert r.status_code == 200, r.text[:300]


def test_stop_matching_costs_the_new_text_whatever_the_list() -> None:
    """Feeding a token's text costs O(its length), not O(list): the longest list allowed feeds about as
    fast as one word (the old matcher searched every word at every token, 4x slower per token)."""
    from pyggml.serve.schemas import MAX_STOP_CHARS, MAX_STOP_WORDS
    from pyggml.serve.textstop import StopMatcher, StopSet

    words = [f"{i:04d}" + "ab" * ((MAX_STOP_CHARS - 4) // 2) for i in range(MAX_STOP_WORDS)]
    pieces = ["ab", "a", "b ", "0001a", "bab"] * 100

    def cost(ws: list[str]) -> float:
        s = StopSet(ws)
        m = StopMatcher(s)
        t = time.perf_counter()
        for p in pieces:
            m.feed(p)
        return time.perf_counter() - t

    small, big = min(cost(["0001ab"]) for _ in range(3)), min(cost(words) for _ in range(3))
    assert big < 5 * small + 0.05, (small, big)  # the old matcher: ~2.7 s here


def test_stop_matcher_agrees_with_a_plain_search() -> None:
    """The automaton stops where a search of the whole text for the first (leftmost) stop string would,
    and holds back exactly the longest end of the text that begins a stop string."""
    import random

    from pyggml.serve.textstop import StopMatcher, StopSet

    rng = random.Random(1)
    for _ in range(300):
        words = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abcd") for _ in range(30))
        m = StopMatcher(StopSet(words))
        out, pos = "", 0
        while pos < len(text) and not m.stopped:
            n = rng.randint(1, 4)
            out += m.feed(text[pos:pos + n])
            pos += n
            if not m.stopped:  # held back: the longest suffix that is a proper prefix of a word
                seen = text[:pos]
                held = max((k for w in words for k in range(1, len(w)) if seen.endswith(w[:k])), default=0)
                assert out == seen[:len(seen) - held]
        hits = [(i, w) for w in words if (i := text[:pos].find(w)) >= 0]
        if hits:
            i, w = min(hits, key=lambda h: (h[0], len(h[1])))
            assert m.stopped and m.word == w and m.text == text[:i] and out == text[:i], (words, text)
        else:
            assert not m.stopped and out + m.flush() == text[:pos]


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}',
    b'{"content": "a\\udc00b"}',
])
def test_lone_surrogates_are_a_400(client: TestClient, body: bytes) -> None:
    path = "/tokenize" if b"messages" not in body else "/v1/chat/completions"
    msg = _error(client.post(path, content=body, headers={"content-type": "application/json"}), 400)
    assert "surrogate" in msg


def test_deep_json_is_a_400(client: TestClient) -> None:
    deep = b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    msg = _error(client.post("/v1/completions", content=deep, headers={"content-type": "application/json"}), 400)
    assert "deep" in msg or "nest" in msg


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(client: TestClient, literal: str) -> None:
    body = f'{{"prompt": "a", "max_tokens": 1, "temperature": {literal}}}'.encode()
    msg = _error(client.post("/v1/completions", content=body, headers={"content-type": "application/json"}), 400)
    assert literal.lstrip("-") in msg


def test_huge_penalties_are_clamped_without_warnings(client: TestClient, served: tuple[TestClient, Any]) -> None:
    """presence_penalty 1e308 (beyond float32) is clamped to float32's largest value, as llama-server's
    float fields; the penalty pass neither warns nor fails. A negative temperature is clamped to 0."""
    from pyggml.serve.app import task_params
    from pyggml.serve.schemas import CompletionRequest, parse

    req = parse(b'{"prompt": "a", "presence_penalty": 1e308, "frequency_penalty": -1e300, "temperature": -5}',
                CompletionRequest)
    sp = task_params(req, 0).sampling
    f32max = float(__import__("numpy").finfo("float32").max)
    assert sp.penalty_present == f32max and sp.penalty_freq == -f32max and sp.temp == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = client.post("/v1/completions", json={"prompt": "a b a b", "max_tokens": 3, "presence_penalty": 1e308,
                                                  "repeat_last_n": 64, "temperature": 0.5, "seed": 3})
    assert r.status_code == 200, r.text[:300]
    assert math.isfinite(r.json()["usage"]["completion_tokens"])


@pytest.mark.parametrize("path", ["/v1/models/", "/health/", "/v1/chat/completions/"])
def test_trailing_slash_is_a_404_not_a_redirect(client: TestClient, path: str) -> None:
    method = client.post if "completions" in path else client.get
    kw = {"json": CHAT} if "completions" in path else {}
    r = method(path, headers={"host": "evil.example"}, follow_redirects=False, **kw)
    assert "location" not in r.headers
    _error(r, 404)


# ---------------------------------------------------------------------- the samplers' request fields (#30 item 3)
def test_sampler_fields_map_to_the_chain_with_llama_server_limits(served: tuple[TestClient, Any]) -> None:
    """llama-server's names and limits: xtc_* and mirostat clamped, dry_base below 1 is the default,
    samplers as names or letters, logit_bias as pairs or an object, by id or text, false bans."""
    from pyggml.serve.app import task_params
    from pyggml.serve.schemas import CompletionRequest, parse

    vocab = served[1].vocab
    body = {"prompt": "a", "typical_p": 0.9, "top_n_sigma": 1.5, "xtc_probability": 3, "xtc_threshold": -1,
            "dry_multiplier": 0.8, "dry_base": 0.5, "dry_allowed_length": 3, "dry_penalty_last_n": 32,
            "dry_sequence_breakers": ["\n"], "mirostat": 7, "mirostat_tau": 4.0, "mirostat_eta": 0.2, "min_keep": 2,
            "samplers": "edkt", "logit_bias": [[5, 1.5], ["hello", False]]}
    sp = task_params(parse(json.dumps(body).encode(), CompletionRequest), 0, None, vocab).sampling
    hello = vocab.tokenize("hello", add_special=False, parse_special=False)
    assert (sp.typ_p, sp.top_n_sigma, sp.xtc_probability, sp.xtc_threshold) == (0.9, 1.5, 1.0, 0.0)
    assert (sp.dry_multiplier, sp.dry_base, sp.dry_allowed_length, sp.dry_penalty_last_n) == (0.8, 1.75, 3, 32)
    assert sp.dry_sequence_breakers == ("\n",) and (sp.mirostat, sp.mirostat_tau, sp.mirostat_eta) == (2, 4.0, 0.2)
    assert sp.samplers == ("penalties", "dry", "top_k", "temperature") and sp.min_keep == 2
    assert sp.logit_bias == ((5, 1.5), *((t, -math.inf) for t in hello))
    body = {"prompt": "a", "samplers": ["Top-K", "nucleus", "temp"], "logit_bias": {"7": -2, "8": False}}
    sp = task_params(parse(json.dumps(body).encode(), CompletionRequest), 0, None, vocab).sampling
    assert sp.samplers == ("top_k", "top_p", "temperature") and sp.logit_bias == ((7, -2.0), (8, -math.inf))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("samplers", ["top_k", "bogus"], "bogus"), ("samplers", "kq", "'q'"), ("samplers", ["infill"], "not supported"),
    ("logit_bias", [[100000, 1]], "100000"), ("logit_bias", [[5, True]], "bias"), ("logit_bias", [5], "pair"),
    ("dry_sequence_breakers", [], "dry_sequence_breakers"), ("dry_allowed_length", -1, "dry_allowed_length"),
])
def test_bad_sampler_fields_are_400s_naming_them(client: TestClient, field: str, value: Any, says: str) -> None:
    msg = _error(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, field: value}), 400)
    assert field in msg and says in msg


def test_logit_bias_bans_the_greedy_token_and_new_samplers_run(client: TestClient) -> None:
    """Served end to end: banning the greedy first token changes it; DRY, XTC, top-n-sigma and mirostat
    requests run, and a seed makes them repeat."""
    body = {"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0, "logprobs": 1}

    def first(extra: dict) -> int:
        r = client.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 200, r.text[:300]
        return r.json()["choices"][0]["logprobs"]["content"][0]["id"]

    greedy = first({})
    assert first({"logit_bias": [[greedy, False]]}) != greedy
    assert first({"logit_bias": {str(greedy): 0}}) == greedy
    for extra in ({"mirostat": 2}, {"mirostat": 1, "mirostat_tau": 3}, {"dry_multiplier": 0.8, "xtc_probability": 0.5,
                                                                      "top_n_sigma": 2, "typical_p": 0.9}):
        req = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.9, "seed": 11, **extra}
        texts = [client.post("/v1/completions", json=req).json()["choices"][0]["text"] for _ in range(2)]
        assert texts[0] == texts[1]


async def _tokenize_request(state: Any, payload: dict, before_disconnect: Any) -> list[dict]:
    """POST ``payload`` to /tokenize straight through the ASGI app: the body, then (once
    ``before_disconnect()`` returns, awaited if it is a coroutine) the client's disconnect; the messages sent."""
    from pyggml.serve.app import create_app

    body, sent, out = json.dumps(payload).encode(), [], []

    async def receive() -> dict:
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        waiting = before_disconnect()
        if waiting is not None:
            await waiting
        return {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        out.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/tokenize", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "scheme": "http", "server": ("t", 80),
             "client": ("c", 1), "http_version": "1.1", "asgi": {"version": "3.0"}}
    await create_app(state)(scope, receive, send)
    return out


def test_models_names_the_file_not_its_path(client: TestClient, tiny_chat_path) -> None:
    """/v1/models and a reply's ``model`` name the GGUF file, never the absolute path on the server's disk."""
    model = client.get("/v1/models").json()["data"][0]["id"]
    assert model == tiny_chat_path.name and "/" not in model
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
    assert r.json()["model"] == tiny_chat_path.name
