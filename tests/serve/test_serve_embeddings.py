"""``pyggml serve --embedding``: /v1/embeddings, /embedding and /embeddings against llama-server's replies.

The reference (tests/data/serve/llama_server_reference.json, made by make_llama_server_reference.py)
holds llama-server's answers on tests/data/archs' tiny bert, nomic-bert and gemma-embedding models
(their own pooling; bert also with --pooling none) and on the tiny chat model with --pooling last. The
same requests go to pyggml's app in-process with the same flags; vectors must agree to 1e-4, base64
vectors decoded first, and the layouts, counts and errors must be the same.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from helpers import data
from helpers.serve_util import in_process_server

#: llama-server made the reference with flash attention off (pyggml's -fa default is auto)
FA_OFF = ["-fa", "off"]

REF = json.loads((data.TESTS / "data" / "serve" / "llama_server_reference.json").read_text())
ARCHS = data.TESTS / "data" / "archs"
CONFIGS = {"bert_embd": ("bert", []), "nomic-bert_embd": ("nomic-bert", []),
           "gemma-embedding_embd": ("gemma-embedding", []), "bert_embd_none": ("bert", ["--pooling", "none"]),
           "tiny_embd_last": (None, ["--pooling", "last"])}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def served(request: pytest.FixtureRequest, tiny_chat_path: Path) -> Iterator[tuple[str, TestClient]]:
    name = request.param
    arch, extra = CONFIGS[name]
    path = tiny_chat_path if arch is None else ARCHS / f"{arch}.gguf"
    with in_process_server(["-m", str(path), *REF["embd_args"], *extra, "-t", "1", "-q", *FA_OFF]) as (client, _):
        yield name, client


def vectors(body: Any) -> list[np.ndarray]:
    """The vectors of a reply, either layout, base64 decoded."""
    if isinstance(body, list):  # native: [{"index", "embedding": [[...], ...]}]
        return [np.array(row, dtype=np.float64) for item in body for row in item["embedding"]]
    out = []
    for item in body["data"]:
        e = item["embedding"]
        out.append(np.frombuffer(base64.b64decode(e), "<f4").astype(np.float64) if isinstance(e, str) else
                   np.array(e, dtype=np.float64))
    return out


def test_embedding_replies_match_llama_server(served: tuple[str, TestClient]) -> None:
    name, client = served
    for req_name, ref in REF["server"][name].items():
        r = client.post(ref["path"], json=ref["request"])
        assert r.status_code == ref["status"], (req_name, r.text[:300])
        body, rb = r.json(), ref["body"]
        if ref["status"] != 200:
            assert body["error"] == rb["error"], req_name
            continue
        if req_name == "completion":  # --embedding keeps a model's completions
            assert body["content"] == rb["content"]
            continue
        if isinstance(rb, dict):
            assert set(body) == set(rb) and body["object"] == "list" and body["usage"] == rb["usage"]
            assert body["model"] == Path(rb["model"]).name  # a name, never this machine's path
            assert [set(d) for d in body["data"]] == [set(d) for d in rb["data"]]
            assert [d["index"] for d in body["data"]] == list(range(len(rb["data"])))
        else:
            assert [(d["index"], len(d["embedding"])) for d in body] == [(d["index"], len(d["embedding"])) for d in rb]
        got, want = vectors(body), vectors(rb)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=1e-4, err_msg=f"{name} {req_name}")


def test_embeddings_need_the_flag_and_fit_a_ubatch(tiny_chat_path: Path) -> None:
    with in_process_server(["-m", str(tiny_chat_path), "-c", "512", "-np", "1", "-t", "1", "-q", *FA_OFF],
                           start=False) as (client, _):
        r = client.post("/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 501 and "--embeddings" in r.json()["error"]["message"]
    with in_process_server(["-m", str(ARCHS / "bert.gguf"), "-c", "512", "-np", "1", "-ub", "16", "-t", "1", "-q",
                            *FA_OFF, "--embedding"]) as (client, _):
        r = client.post("/v1/embeddings", json={"input": "word " * 40})
        assert r.status_code == 400 and "too large to process" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 501 and "embeddings, not text" in r.json()["error"]["message"]


def test_openai_client_embeddings() -> None:
    """The openai package asks for base64 by default and decodes it: llama-server's vectors."""
    openai = pytest.importorskip("openai")
    argv = ["-m", str(ARCHS / "bert.gguf"), *REF["embd_args"], "-t", "1", "-q", *FA_OFF]
    with in_process_server(argv) as (client, _):
        oc = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
        r = oc.embeddings.create(model="bert", input=["hello world", "a cat sat"])
    ref = REF["server"]["bert_embd"]["v1_list_base64"]["body"]  # the same two texts and [5, 6, 7]
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == ref["usage"]["prompt_tokens"] - 3
    for d, w in zip(r.data, vectors(ref), strict=False):
        np.testing.assert_allclose(np.array(d.embedding), w, atol=1e-4)
