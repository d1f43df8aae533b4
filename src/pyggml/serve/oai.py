"""Response bodies of the OpenAI-compatible endpoints, with llama-server's fields.

Non-streamed: ``chat.completion`` / ``text_completion`` objects with ``usage`` and llama-server's
``timings``. Streamed: one ``*.chunk`` per piece of text as server-sent events (``data: {...}``),
a last chunk with the finish reason, an optional usage chunk (``stream_options.include_usage``),
then ``data: [DONE]``. Token probabilities use the ``logprobs.content`` layout for both endpoints,
as llama-server writes them.
"""

from __future__ import annotations

import json
import secrets
import string
import time
from typing import Any

from .engine import DoneEvent

FINGERPRINT = "pyggml"


def completion_id(prefix: str) -> str:
    alphabet = string.ascii_letters + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(32))


def usage(done: DoneEvent) -> dict[str, Any]:
    return {"completion_tokens": done.n_decoded, "prompt_tokens": done.n_prompt,
            "total_tokens": done.n_prompt + done.n_decoded,
            "prompt_tokens_details": {"cached_tokens": done.n_cached}}


class Formatter:
    """Builds the bodies of one response (its id, creation time and model name are shared by all chunks)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = completion_id("chatcmpl-" if chat else "cmpl-")
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        obj = self.object + ".chunk" if chunk and self.chat else self.object
        return {"choices": choices, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "object": obj, "id": self.id}

    def full(self, done: DoneEvent, probs: list[dict[str, Any]] | None, message: dict[str, Any] | None = None,
             finish: str | None = None) -> dict[str, Any]:
        """The whole response; ``message``/``finish``: the parsed assistant message (tool calls, reasoning)
        and its finish reason, when the reply was parsed (tool_calls.parse_reply)."""
        choice: dict[str, Any] = {"finish_reason": finish or done.finish_reason, "index": 0}
        if self.chat:
            choice["message"] = message or {"role": "assistant", "content": done.full_text}
        else:
            choice["text"] = done.full_text
        choice["logprobs"] = {"content": probs} if probs is not None else None
        body = self._envelope([choice], chunk=False)
        body["usage"] = usage(done)
        body["timings"] = done.timings
        return body

    def chunk(self, text: str | None, probs: list[dict[str, Any]] | None = None, finish: str | None = None,
              role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"finish_reason": finish, "index": 0}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": None}
            elif text is not None:
                delta = {"content": text}
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = {"content": probs} if probs is not None else None
        return self._envelope([choice], chunk=True)

    def delta_chunk(self, delta: dict[str, Any], probs: list[dict[str, Any]] | None = None,
                    finish: str | None = None) -> dict[str, Any]:
        """A chat chunk with a delta made by tool_calls.StreamParser (content, reasoning_content, tool_calls)."""
        choice = {"finish_reason": finish, "index": 0, "delta": delta,
                  "logprobs": {"content": probs} if probs is not None else None}
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, done: DoneEvent) -> dict[str, Any]:
        body = self._envelope([], chunk=True)
        body["usage"] = usage(done)
        body["timings"] = done.timings
        return body


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def sse_error(body: dict[str, Any]) -> bytes:
    """An error in a stream already started: a ``data: {"error": {...}}`` event, as llama-server sends."""
    return sse(body)
