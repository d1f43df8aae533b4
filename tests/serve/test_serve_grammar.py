"""Structured output from ``pyggml serve`` (tiny chat model): OpenAI's response_format (json_object,
json_schema, ``client.chat.completions.parse`` with pydantic), llama-server's "json_schema" and "grammar"
fields, streamed and not, and llama-server's refusals."""

from __future__ import annotations

import json
from typing import Literal

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pydantic = pytest.importorskip("pydantic")

from helpers.serve_util import live_server  # noqa: E402
from pyggml.llm.grammar import LlamaGrammar  # noqa: E402

pytestmark = pytest.mark.subprocess

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
          "required": ["ok", "n"], "additionalProperties": False}


class Answer(pydantic.BaseModel):
    ok: bool
    n: Literal[1, 2, 3]


def _fits(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {"ok", "n"} and isinstance(value["ok"], bool) \
        and value["n"] in (1, 2, 3)


def test_structured_output(tiny_chat_path, tmp_path) -> None:
    with live_server(["-m", str(tiny_chat_path), "-c", "1024", "-np", "2", "-t", "2", "-q"],
                     tmp_path / "serve.log") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "Answer as JSON."}]
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=80, temperature=0,
                                           response_format=fmt)
        assert _fits(json.loads(r.choices[0].message.content)) and r.choices[0].finish_reason == "stop"
        parsed = client.chat.completions.parse(model="tiny", messages=msgs, max_tokens=80, temperature=0.7, seed=3,
                                               response_format=Answer)
        assert isinstance(parsed.choices[0].message.parsed, Answer)
        stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=80, temperature=0,
                                                response_format=fmt, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == r.choices[0].message.content
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=150, temperature=0,
                                           response_format={"type": "json_object"})
        assert isinstance(json.loads(r.choices[0].message.content), dict)

        grammar = 'root ::= [a-z]{1,6} (" " [a-z]{1,6}){2,4} "."'
        body = {"prompt": "hello", "max_tokens": 40, "temperature": 0, "grammar": grammar}
        text = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        assert LlamaGrammar.from_text(grammar).validate(text)[0], text
        body = {"prompt": "hello", "max_tokens": 80, "temperature": 0, "json_schema": SCHEMA}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert _fits(json.loads(r.json()["choices"][0]["text"]))

        def error(path: str, body: dict) -> str:
            r = httpx.post(url + path, json=body, timeout=60)
            assert r.status_code == 400, r.text
            return r.json()["error"]["message"]

        assert "Undefined rule identifier 'nope'" in error("/v1/completions",
                                                           {"prompt": "x", "grammar": "root ::= nope"})
        assert "minItems must be a non-negative integer" in error(
            "/v1/completions", {"prompt": "x", "json_schema": {"type": "array", "minItems": -1}})
        chat = {"messages": msgs}
        assert error("/v1/chat/completions", {**chat, "grammar": 'root ::= "a"', "json_schema": SCHEMA}) \
            == "Cannot use both json_schema and grammar"
        assert "must be one of" in error("/v1/chat/completions", {**chat, "response_format": {"type": "xml"}})
