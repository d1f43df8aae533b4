"""Request bodies as pydantic models, with llama-server's field names and defaults.

Unknown fields are accepted and ignored (as llama-server ignores them), but a known field of the
wrong type is refused: the models are strict, so ``"max_tokens": "5"`` is an error rather than a
silent conversion. :func:`parse` turns any failure into one readable 400 error message.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import APIError

_CONFIG = ConfigDict(extra="allow", strict=True)
T = TypeVar("T", bound="BaseModel")


class StreamOptions(BaseModel):
    model_config = _CONFIG
    include_usage: bool = False


class GenerationParams(BaseModel):
    """The generation and sampling fields shared by /v1/completions and /v1/chat/completions."""

    model_config = _CONFIG
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=-1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=-1)] | None = None
    n_predict: Annotated[int, Field(ge=-1)] | None = None  # llama-server's native name; -1 = until end of generation
    temperature: float = 0.8
    top_k: int = 40
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    repeat_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    repeat_last_n: Annotated[int, Field(ge=-1)] = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None or -1: a random seed
    stop: str | list[str] | None = None
    n_probs: Annotated[int, Field(ge=0, le=100)] = 0
    n: Annotated[int, Field(ge=1)] = 1
    cache_prompt: bool = True
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF (llama-server's "grammar")
    json_schema: dict[str, Any] | None = None  # a JSON schema the output must follow (llama-server's "json_schema")

    def n_predict_value(self, default: int = -1) -> int:
        """max_completion_tokens, max_tokens or n_predict (the first given); -1 = no limit."""
        for v in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if v is not None:
                return v
        return default

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class TextPart(BaseModel):
    model_config = _CONFIG
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = _CONFIG
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as the template sees it: text parts joined (llama-server refuses other parts
        for a text-only model)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        out = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(f"unsupported content part type {part.type!r}: this model reads text only")
            out.append(part.text)
        return "\n".join(out)


class ChatCompletionRequest(GenerationParams):
    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: dict[str, Any] | None = None  # OpenAI's {"type": "text" | "json_object" | "json_schema", ...}

    def n_probs_value(self) -> int:
        """OpenAI's logprobs/top_logprobs in llama-server's terms (n_probs >= 1 when logprobs is on)."""
        if self.logprobs:
            return max(self.top_logprobs or 0, self.n_probs, 1)
        return self.n_probs


class CompletionRequest(GenerationParams):
    prompt: str | list[int] | list[str]
    logprobs: Annotated[int, Field(ge=0, le=100)] | None = None

    def n_probs_value(self) -> int:
        return self.logprobs if self.logprobs is not None else self.n_probs


class TokenizeRequest(BaseModel):
    model_config = _CONFIG
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _CONFIG
    tokens: list[int]


def parse(raw: bytes, model: type[T]) -> T:
    """Parse a request body; malformed JSON or a wrong field is an APIError (400), never a traceback."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise APIError(_describe(e)) from None


def _describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:4]:
        where = ".".join(str(x) for x in err["loc"]) or "body"
        got: Any = err.get("input")
        shown = json.dumps(got)[:60] if isinstance(got, str | int | float | bool | type(None)) else type(got).__name__
        parts.append(f"'{where}': {err['msg']} (got {shown})")
    return "invalid request: " + "; ".join(parts)
