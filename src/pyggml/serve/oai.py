"""Response bodies of the OpenAI-compatible endpoints, with llama-server's fields.

Non-streamed: ``chat.completion`` / ``text_completion`` objects with ``usage`` and llama-server's
``timings``. Streamed: one ``*.chunk`` per piece of text as server-sent events (``data: {...}``),
a last chunk with the finish reason, an optional usage chunk (``stream_options.include_usage``),
then ``data: [DONE]``. Token probabilities use the ``logprobs.content`` layout for both endpoints,
as llama-server writes them; on /v1/completions the same object also carries OpenAI's legacy
completions fields (``tokens``, ``token_logprobs``, ``top_logprobs`` as ``{text: logprob}``,
``text_offset``), so clients written for either API find theirs.
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
        self.text_offset: dict[int, int] = {}  # per choice: characters of text sent so far (text_offset)

    def logprobs(self, probs: list[dict[str, Any]] | None, index: int = 0) -> dict[str, Any] | None:
        """The choice's ``logprobs`` object: llama-server's ``content`` list, and on /v1/completions
        OpenAI's completions fields beside it."""
        if probs is None:
            return None
        out: dict[str, Any] = {"content": probs}
        if not self.chat:
            offset = self.text_offset.get(index, 0)
            offsets = []
            for p in probs:
                offsets.append(offset)
                offset += len(p["token"])
            self.text_offset[index] = offset
            out.update(completion_logprobs(probs, offsets))
        return out

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        obj = self.object + ".chunk" if chunk and self.chat else self.object
        return {"choices": choices, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "object": obj, "id": self.id}

    def full(self, done: DoneEvent, probs: list[dict[str, Any]] | None, index: int = 0,
             message: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
        """The whole response; ``message``/``finish``: the parsed assistant message (tool calls, reasoning)
        and its finish reason, when the reply was parsed (tool_calls.parse_reply)."""
        choice: dict[str, Any] = {"finish_reason": finish or done.finish_reason, "index": index}
        if self.chat:
            choice["message"] = message or {"role": "assistant", "content": done.full_text}
        else:
            choice["text"] = done.full_text
        choice["logprobs"] = self.logprobs(probs, index)
        body = self._envelope([choice], chunk=False)
        body["usage"] = usage(done)
        body["timings"] = done.timings
        return body

    def chunk(self, text: str | None, probs: list[dict[str, Any]] | None = None, finish: str | None = None,
              role: bool = False, index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {"finish_reason": finish, "index": index}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": None}
            elif text is not None:
                delta = {"content": text}
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self.logprobs(probs, index)
        return self._envelope([choice], chunk=True)

    def delta_chunk(self, delta: dict[str, Any], probs: list[dict[str, Any]] | None = None,
                    finish: str | None = None, index: int = 0) -> dict[str, Any]:
        """A chat chunk with a delta made by tool_calls.StreamParser (content, reasoning_content, tool_calls)."""
        choice = {"finish_reason": finish, "index": index, "delta": delta,
                  "logprobs": self.logprobs(probs, index)}
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, done: DoneEvent) -> dict[str, Any]:
        body = self._envelope([], chunk=True)
        body["usage"] = usage(done)
        body["timings"] = done.timings
        return body


def completion_logprobs(probs: list[dict[str, Any]], offsets: list[int]) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs`` fields from llama-server's per-token entries: each token's
    text, its log-probability, its alternatives as ``{text: logprob}`` and its offset in the text."""
    return {"tokens": [p["token"] for p in probs], "token_logprobs": [p["logprob"] for p in probs],
            "top_logprobs": [{t["token"]: t["logprob"] for t in p["top_logprobs"]} for p in probs],
            "text_offset": offsets}


def with_usage(final: dict[str, Any], done: DoneEvent, include_usage: bool) -> dict[str, Any]:
    """A stream's finishing chunk: it carries usage and timings itself unless a usage chunk follows
    (stream_options.include_usage), as llama-server's."""
    if not include_usage:
        final["usage"] = usage(done)
        final["timings"] = done.timings
    return final


def stream_end(fmt: Formatter, final: dict[str, Any], done: DoneEvent, include_usage: bool) -> list[bytes]:
    """A one-choice stream's last events: the finishing chunk, the usage chunk when asked, ``[DONE]``."""
    tail = [sse(with_usage(final, done, include_usage))]
    if include_usage:
        tail.append(sse(fmt.usage_chunk(done)))
    return [*tail, sse("[DONE]")]


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def sse_error(body: dict[str, Any]) -> bytes:
    """An error in a stream already started: a ``data: {"error": {...}}`` event, as llama-server sends."""
    return sse(body)
