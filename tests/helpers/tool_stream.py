"""A reply fed to the tool-call StreamParser in pieces, its deltas put back together (and checked
against the whole reply the parser returns at the end)."""

from __future__ import annotations

from typing import Any

from pyggml.llm.tool_calls import ChatParams, StreamParser


def streamed(params: ChatParams, text: str, step: int, truncated: bool = False) -> dict[str, Any]:
    """The reply put together from StreamParser's deltas, fed ``step`` characters at a time."""
    sp = StreamParser(params)
    deltas = []
    for i in range(0, len(text), step):
        deltas += sp.feed(text[i:i + step])
    reply, last = sp.finish(truncated)
    deltas += last
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            entry = calls.setdefault(c["index"], {"name": "", "arguments": "", "id": ""})
            entry["id"] += c.get("id", "")
            entry["name"] += c.get("function", {}).get("name", "")
            entry["arguments"] += c["function"]["arguments"]
    out = {"content": "".join(d.get("content", "") for d in deltas),
           "reasoning": "".join(d.get("reasoning_content", "") for d in deltas),
           "calls": [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]}
    assert out["content"] == reply.content and out["reasoning"] == reply.reasoning_content
    assert out["calls"] == [(c.name, c.arguments) for c in reply.tool_calls]
    assert [calls[i]["id"] for i in sorted(calls)] == [c.id for c in reply.tool_calls]
    return out
