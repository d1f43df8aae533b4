"""Request bodies as pydantic models, with llama-server's field names and defaults.

No field is silently ignored: a field this server does not know is refused with a 400 error naming
it (llama-server would act on many of them: ``lora``, ``n_keep``, ``image_data``..., so dropping them
would answer a different request than the one sent); the few OpenAI fields that have no effect in
llama-server either are declared and accepted (see ``NO_EFFECT``). A known field of the wrong type is
refused too: the models are strict, so ``"max_tokens": "5"`` is an error rather than a silent
conversion. :func:`parse` turns any failure into one readable 400 error message.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import APIError

_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
T = TypeVar("T", bound="BaseModel")

#: ``stop``: at most this many strings of at most this many characters. llama-server takes any list and
#: checks each string at every token in C++; here they are compiled into one automaton per request, which
#: these bounds keep under ~0.1 s (OpenAI's API allows 4 stop strings).
MAX_STOP_WORDS = 256
MAX_STOP_CHARS = 512
MAX_DRY_BREAKERS = 32
FLT_MAX = 3.4028234663852886e38  # sampling values are float32 in llama.cpp


def _f32(v: float) -> float:
    """A finite JSON number clamped into float32's range: llama-server reads these fields as float, so
    1e308 is not an error but the largest float (and never numpy's overflow warning later)."""
    return min(max(v, -FLT_MAX), FLT_MAX)


def _at_least(lo: float) -> AfterValidator:
    """llama-server's set_limits: a value below the field's range is clamped, not refused."""
    return AfterValidator(lambda v: max(v, lo))


def _within(lo: float, hi: float) -> AfterValidator:
    """llama-server's set_limits on both sides: clamped into [lo, hi]."""
    return AfterValidator(lambda v: min(max(v, lo), hi))


F32 = Annotated[float, AfterValidator(_f32)]
Probability = Annotated[F32, _within(0.0, 1.0)]


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
    temperature: Annotated[F32, _at_least(0.0)] = 0.8
    top_k: int = 40
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    repeat_penalty: Annotated[F32, Field(gt=0.0)] = 1.0
    repeat_last_n: Annotated[int, Field(ge=-1)] = 64
    presence_penalty: F32 = 0.0
    frequency_penalty: F32 = 0.0
    seed: int | None = None  # None or -1: a random seed
    stop: str | list[str] | None = None
    n_probs: Annotated[int, Field(ge=0, le=100)] = 0
    n: Annotated[int, Field(ge=1)] = 1
    cache_prompt: bool = True
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF (llama-server's "grammar")
    json_schema: dict[str, Any] | None = None  # a JSON schema the output must follow (llama-server's "json_schema")
    # llama-server's lazy grammar: "grammar" constrains only once a trigger appears in the output
    grammar_lazy: bool = False
    #: [{"type": 0 token | 1 word | 2 pattern | 3 pattern_full, "value": str, "token": id (type 0)}, ...]
    grammar_triggers: list[dict[str, Any]] | None = None
    preserved_tokens: list[str] | None = None  # single-token texts sent as text (and usable as token triggers)
    # llama.cpp's other samplers, as llama-server names and limits them (server-schema.cpp)
    typical_p: F32 = 1.0
    top_n_sigma: F32 = -1.0
    xtc_probability: Probability = 0.0
    xtc_threshold: Probability = 0.1
    dry_multiplier: F32 = 0.0
    dry_base: F32 = 1.75  # below 1: the server's default, as llama-server
    dry_allowed_length: Annotated[int, Field(ge=0)] = 2
    dry_penalty_last_n: Annotated[int, Field(ge=0)] = 64
    #: llama.cpp cuts each to 40 bytes; each is looked for in every token's text, hence the bound on their number
    dry_sequence_breakers: Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]],
                                     Field(min_length=1, max_length=MAX_DRY_BREAKERS)] | None = None
    mirostat: Annotated[int, _within(0, 2)] = 0
    mirostat_tau: F32 = 5.0
    mirostat_eta: F32 = 0.1
    min_keep: Annotated[int, Field(ge=0)] = 0
    #: [[token id or text, bias or false], ...] or {"token id or text": bias or false}; false bans the token
    logit_bias: list[Any] | dict[str, Any] | None = None
    #: llama.cpp's sampler names in order, or one string of their letters ("edskypmxt")
    samplers: list[str] | str | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        words = [v] if isinstance(v, str) else v or []
        if len(words) > MAX_STOP_WORDS:
            raise ValueError(f"at most {MAX_STOP_WORDS} stop strings are accepted, got {len(words)}")
        for i, w in enumerate(words):
            if len(w) > MAX_STOP_CHARS:
                raise ValueError(f"stop string {i} has {len(w)} characters, more than the limit of {MAX_STOP_CHARS}")
        return v

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


class ToolCallFunction(BaseModel):
    model_config = _CONFIG
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; an object is taken too


class ToolCallIn(BaseModel):
    """An assistant message's tool call sent back in the conversation."""

    model_config = _CONFIG
    id: str = ""
    type: str = "function"
    function: ToolCallFunction
    index: int | None = None  # what a client accumulating streamed deltas may leave in


class Message(BaseModel):
    model_config = _CONFIG
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None  # OpenAI's participant/tool name, handed to the template
    tool_calls: list[ToolCallIn] | None = None  # assistant messages: the calls it made
    tool_call_id: str | None = None  # tool messages: the call they answer
    reasoning_content: str | None = None  # assistant messages: its reasoning (templates that show it)
    refusal: str | None = None  # OpenAI's assistant refusal text: accepted, not shown (as llama-server)

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template (and tool_calls.apply_chat_template) sees it."""
        if self.role != "assistant" and self.content is None:
            raise APIError("All non-assistant messages must contain 'content'")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise APIError("Assistant message must contain either 'content' or 'tool_calls'!")
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                                           "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out

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
    # tool calling (tool_calls.py): checked there, so a bad one gets a message naming what is wrong
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None  # llama-server's: none, auto, deepseek, deepseek-legacy
    reasoning_effort: str | None = None  # OpenAI's; "none" turns thinking off, else a template variable
    add_generation_prompt: bool = True
    # NO_EFFECT: OpenAI fields llama-server accepts and ignores too (bookkeeping of OpenAI's platform)
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def parse(raw: bytes, model: type[T]) -> T:
    """Parse a request body; malformed JSON or a wrong field is an APIError (400), never a traceback.

    Python's json accepts what JSON (and llama-server's parser) does not: ``NaN``/``Infinity`` and
    ``"\\ud800"``, a UTF-16 surrogate alone, which no UTF-8 text can hold; both are refused here, as is
    nesting deeper than the parser's recursion limit."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError("the request body is not valid JSON: it is nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    _check_unicode(data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise APIError(_describe(e)) from None
    except RecursionError:
        raise APIError("invalid request: a field is nested too deeply") from None


def _check_unicode(data: dict[str, Any]) -> None:
    """Refuse strings holding a lone surrogate (valid JSON escapes, but not Unicode text)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        bad = e.object[e.start]
        raise APIError(f"the request body is not valid Unicode: a lone surrogate U+{ord(bad):04X} in a string "
                       "(a UTF-16 surrogate must come in a high/low pair)") from None
    except RecursionError:
        raise APIError("the request body is not valid JSON: it is nested too deeply") from None


#: declared fields that are accepted and change nothing (llama-server ignores them as well)
NO_EFFECT = ("user", "store", "metadata", "service_tier", "refusal")


def _describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:4]:
        where = ".".join(str(x) for x in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"'{where}': this server does not support this field (it is refused rather than ignored)")
            continue
        got: Any = err.get("input")
        shown = json.dumps(got)[:60] if isinstance(got, str | int | float | bool | type(None)) else type(got).__name__
        parts.append(f"'{where}': {err['msg']} (got {shown})")
    return "invalid request: " + "; ".join(parts)
