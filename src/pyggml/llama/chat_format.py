"""Chat formats and the chat-completion handler of llama-cpp-python's ``Llama.create_chat_completion``.

A chat format turns messages into a prompt (:class:`ChatFormatterResponse`: the text, extra stop
strings, whether the text already carries its special tokens); the handler tokenizes it, adds
``response_format``'s grammar or a forced tool's, runs ``create_completion`` and reshapes its dict
(or its stream of chunks) into OpenAI's chat shapes, as llama-cpp-python's
``chat_formatter_to_chat_completion_handler`` does.

The GGUF's own template (``tokenizer.chat_template``, format name ``chat_template.default``) is
rendered with jinja2 in a sandbox, with the variables llama-cpp-python hands it (``messages``,
``bos_token``/``eos_token`` as the tokens' texts, ``add_generation_prompt``, ``tools``,
``tool_choice``, ``functions``, ``function_call``, ``raise_exception``, ``strftime_now``). The
hand-written formats llama-cpp-python registers are here for the common names (``chatml``,
``llama-2``, ``llama-3``, ``gemma``), and its ``chatml-function-calling`` handler (the one its
function-calling documentation uses); another name is refused with the list.

Tools: as in llama-cpp-python, ``tools`` are handed to the template and a ``tool_choice`` naming a function
forces a call of it (its arguments constrained to its parameter schema). When the template's model
writes tool calls in a format pyggml's llm/tool_calls knows (Qwen2.5's Hermes ``<tool_call>``, Llama 3.x,
Mistral), the reply of "auto" is also split into ``content`` and ``tool_calls`` (llama-cpp-python leaves
the raw text in ``content``; the generated text is the same), and "required" forces a call.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
import jinja2.ext
import markupsafe
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import htmlsafe_json_dumps

from ..llm import tool_calls
from ..llm.chat import ChatTemplate
from .grammar import JSON_GBNF, LlamaGrammar
from .processors import StoppingCriteriaList

if TYPE_CHECKING:
    from .api import Llama


@dataclass
class ChatFormatterResponse:
    """A formatted prompt: the text, stop strings the format adds, a stopping criterion, and whether
    the text holds its own special tokens (then no BOS is added when it is tokenized)."""

    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    added_special: bool = False


ChatFormatter = Callable[..., ChatFormatterResponse]


class _GenerationTag(jinja2.ext.Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` marks: rendered as their content."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise ValueError(message)


class Jinja2ChatFormatter:
    """A chat template in jinja2 (a GGUF's ``tokenizer.chat_template``), as llama-cpp-python renders it:
    no BOS is stripped (the prompt is tokenized without adding one), the EOS text is a stop string
    and the EOS token id a stopping criterion."""

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: list[int] | None = None) -> None:
        self.template = template
        self.eos_token, self.bos_token = eos_token, bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"the chat template does not parse: {e}") from e

    def __call__(self, *, messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None,
                 function_call: Any = None, tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                 **kwargs: Any) -> ChatFormatterResponse:
        prompt = self._template.render(
            messages=messages, eos_token=self.eos_token, bos_token=self.bos_token, raise_exception=_raise,
            add_generation_prompt=self.add_generation_prompt, functions=functions, function_call=function_call,
            tools=tools, tool_choice=tool_choice,
            strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt), **kwargs)
        criteria = None
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            criteria = StoppingCriteriaList([lambda tokens, logits: len(tokens) > 0 and int(tokens[-1]) in ids])
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token], stopping_criteria=criteria,
                                     added_special=True)

    def to_chat_handler(self) -> Callable[..., Any]:
        return chat_formatter_to_chat_completion_handler(self)


# ---------------------------------------------------------------------- llama-cpp-python's named formats
def _system_message(messages: list[dict[str, Any]]) -> str:
    """The first system message's content ('' when none)."""
    return next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")


def _turns(messages: list[dict[str, Any]], roles: dict[str, str]) -> list[tuple[str, str | None]]:
    """(role prefix, text) for the messages whose role the format knows; non-text content becomes None."""
    return [(roles[m["role"]], m["content"] if isinstance(m.get("content"), str) else None)
            for m in messages if m.get("role") in roles]


def format_chatml(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """``<|im_start|>role\\ntext<|im_end|>\\n`` turns, the first system message first (an empty system turn
    when there is none), ending with an open assistant turn."""
    end = "<|im_end|>"
    text = "<|im_start|>system\n" + _system_message(messages) + end + "\n"
    turns = _turns(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    for prefix, body in [*turns, ("<|im_start|>assistant", None)]:
        text += prefix + "\n" + (body + end + "\n" if body else "")
    return ChatFormatterResponse(prompt=text, stop=end)


def format_llama2(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Llama 2 chat: ``<s>[INST] text [/INST] reply </s>``, the system message in ``<<SYS>>`` (the format
    llama-cpp-python falls back to for a model without a template)."""
    system = _system_message(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    seps = (" ", "</s>")
    text = system + seps[0]
    for i, (prefix, body) in enumerate(_turns(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})):
        if system and i == 0:
            text += (body or "") + seps[i % 2]
        elif body:
            text += prefix + body + " " + seps[i % 2]
        else:
            text += prefix + " "
    return ChatFormatterResponse(prompt=text + "[/INST]")


def _no_colon(messages: list[dict[str, Any]], roles: dict[str, str], sep: str) -> str:
    text = ""
    for prefix, body in [*_turns(messages, roles), (roles["assistant"], None)]:
        text += prefix + (body + sep if body else "")
    return text


def format_llama3(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Llama 3 instruct: ``<|start_header_id|>role<|end_header_id|>\\n\\ntext<|eot_id|>``."""
    roles = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}
    return ChatFormatterResponse(prompt=_no_colon(messages, roles, "<|eot_id|>"), stop="<|eot_id|>")


def format_gemma(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Gemma: ``<start_of_turn>user\\ntext<end_of_turn>\\n`` turns (system messages are dropped)."""
    roles = {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"}
    return ChatFormatterResponse(prompt=_no_colon(messages, roles, "<end_of_turn>\n"), stop="<end_of_turn>\n")


CHAT_FORMATS: dict[str, ChatFormatter] = {"chatml": format_chatml, "llama-2": format_llama2,
                                          "llama-3": format_llama3, "gemma": format_gemma}


def format_names() -> list[str]:
    return sorted([*CHAT_FORMATS, "chatml-function-calling"])


# ---------------------------------------------------------------------- the handler
def _response_format_grammar(response_format: dict[str, Any]) -> LlamaGrammar | None:
    """``{"type": "json_object"}`` (with an optional ``schema``, as llama-cpp-python takes it) or OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``; ``{"type": "text"}`` constrains nothing."""
    if not isinstance(response_format, dict) or "type" not in response_format:
        raise ValueError(f"response_format must be a dict with a 'type', got {response_format!r}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format of type 'json_schema' needs json_schema: {'schema': {...}}")
        schema = spec["schema"]
    else:
        raise ValueError(f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
    if schema is None:
        return LlamaGrammar.from_string(JSON_GBNF)
    try:
        return LlamaGrammar.from_json_schema(schema)
    except Exception:
        return LlamaGrammar.from_string(JSON_GBNF)


def chat_formatter_to_chat_completion_handler(formatter: ChatFormatter) -> Callable[..., Any]:
    """The chat-completion handler over a formatter: what ``create_chat_completion`` calls."""

    def handler(*, llama: Llama, messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None,
                function_call: Any = None, tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                typical_p: float = 1.0, stream: bool = False, stop: str | list[str] | None = None,
                seed: int | None = None, response_format: dict[str, Any] | None = None,
                max_tokens: int | None = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                repeat_penalty: float = 1.1, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                mirostat_eta: float = 0.1, model: str | None = None, logits_processor: Any = None,
                grammar: LlamaGrammar | None = None, logit_bias: dict[Any, float] | None = None,
                logprobs: bool | None = None, top_logprobs: int | None = None, **kwargs: Any) -> Any:
        result = formatter(messages=messages, functions=functions, function_call=function_call, tools=tools,
                           tool_choice=tool_choice, **kwargs)
        prompt = llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        if result.stop is not None:
            user = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
            stop = user + (result.stop if isinstance(result.stop, list) else [result.stop])
        if response_format is not None:
            grammar = _response_format_grammar(response_format) or grammar
        if functions is not None:  # the legacy functions are tools
            tools = [{"type": "function", "function": f} for f in functions]
        if function_call is not None:
            if function_call in ("none", "auto"):
                tool_choice = function_call
            elif isinstance(function_call, dict) and "name" in function_call:
                tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
        tool = None
        if isinstance(tool_choice, dict) and tools is not None:
            name = tool_choice["function"]["name"]
            tool = next((t for t in tools if t["function"]["name"] == name), None)
            if tool is None:
                raise ValueError(f"Tool choice '{name}' not found in tools.")
            try:  # the call's arguments: JSON of the tool's parameter schema
                grammar = LlamaGrammar.from_json_schema(tool["function"]["parameters"])
            except Exception:
                grammar = LlamaGrammar.from_string(JSON_GBNF)
        tool_params = None
        if tools and tool is None and tool_choice != "none":
            tool_params = _tool_call_params(formatter, messages, tools, tool_choice)
            if tool_params is not None and tool_choice == "required":
                grammar = LlamaGrammar(_grammar=tool_params.grammar)
        out = llama.create_completion(
            prompt=prompt, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            logprobs=top_logprobs if logprobs else None, stream=stream, stop=stop, seed=seed, max_tokens=max_tokens,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            model=model, logits_processor=logits_processor, stopping_criteria=result.stopping_criteria,
            grammar=grammar, logit_bias=logit_bias, **_preserved(llama, tool_params))
        if tool is not None:
            name = tool["function"]["name"]
            return _chunks_to_tool_call(name, out) if stream else _completion_to_tool_call(name, out)
        if tool_params is not None:
            return _chunks_to_parsed_chat(out, tool_params) if stream else _completion_to_parsed_chat(out, tool_params)
        return _chunks_to_chat(out) if stream else _completion_to_chat(out)

    return handler


# ---------------------------------------------------------------------- tool calls the model writes itself
def _tool_call_params(formatter: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                      tool_choice: Any) -> tool_calls.ChatParams | None:
    """How to read tool calls out of the reply when the template's model writes them in a known format
    (Hermes ``<tool_call>``, Llama 3.x JSON, Mistral ``[TOOL_CALLS]``, the others of llm/tool_calls.py): as
    llama-server does. None for a template without one: then, as llama-cpp-python, the tools are only
    shown to the template and the reply is plain content.

    With ``tool_choice`` "auto" (or None) the prompt and the text generated are llama-cpp-python's (no
    grammar); only the reply is split into ``content`` and ``tool_calls``. "required" (which
    llama-cpp-python ignores) also constrains the reply to calls of the tools."""
    source = getattr(formatter, "template", None)
    if not isinstance(source, str):
        return None
    tpl = ChatTemplate(source, formatter.bos_token, formatter.eos_token)
    try:
        params = tool_calls.apply_chat_template(tpl, messages, tools=tools, tool_choice=tool_choice or "auto",
                                                reasoning_format="none")
    except tool_calls.ToolCallError as e:
        raise ValueError(str(e)) from None
    if params.format in (tool_calls.ToolFormat.GENERIC, tool_calls.ToolFormat.CONTENT_ONLY):
        if tool_choice == "required":
            raise ValueError("tool_choice 'required' needs a chat template whose model writes tool calls in a format "
                             "pyggml knows (Hermes <tool_call>, Llama 3.x, Mistral, Qwen3-Coder, GPT-OSS, LFM2, "
                             "Functionary, DeepSeek R1...); name the function in tool_choice instead")
        return None
    return params


def _preserved(llama: Llama, params: tool_calls.ChatParams | None) -> dict[str, Any]:
    """create_completion's argument keeping the tool-call markers (Qwen's ``<tool_call>`` is a control
    token, which the completion's text would otherwise leave out) in the text the parser reads."""
    if params is None or not params.preserved_tokens:
        return {}
    ids = {llama.tokenize(t.encode("utf-8"), add_bos=False, special=True)[0] for t in params.preserved_tokens}
    return {"_preserved_tokens": ids}


def _completion_to_parsed_chat(c: dict[str, Any], params: tool_calls.ChatParams) -> dict[str, Any]:
    """The reply split into content and tool calls (cut by max_tokens, an unfinished call is read as far
    as it went and the finish reason stays "length")."""
    chat = _completion_to_chat(c)
    finish = c["choices"][0]["finish_reason"]
    reply = tool_calls.parse_reply(c["choices"][0]["text"], params, partial=finish == "length")
    if reply.tool_calls:
        choice = chat["choices"][0]
        choice["message"] = reply.to_openai()
        choice["finish_reason"] = "length" if finish == "length" else "tool_calls"
    return chat


def _chunks_to_parsed_chat(chunks: Iterator[dict[str, Any]], params: tool_calls.ChatParams) -> Iterator[dict[str, Any]]:
    """A stream whose deltas carry ``content`` and ``tool_calls`` (index, id, name, then the arguments in
    pieces), as llama-server streams them; the last chunk's finish reason is "tool_calls" when any came."""
    parser = tool_calls.StreamParser(params)
    first = None
    for c in chunks:
        ch = c["choices"][0]
        if first is None:
            first = c
            yield _chunk(c, {"role": "assistant"}, None, None)
        if ch["finish_reason"] is None:
            for delta in parser.feed(ch["text"]):
                yield _chunk(c, delta, None, None)
            continue
        reply, deltas = parser.finish(truncated=ch["finish_reason"] == "length")
        for delta in deltas:
            yield _chunk(c, delta, None, None)
        done = "tool_calls" if reply.tool_calls and ch["finish_reason"] != "length" else ch["finish_reason"]
        yield _chunk(c, {}, None, done)


# ---------------------------------------------------------------------- completion dicts -> chat dicts
def _chat_logprobs(logprobs: dict[str, Any] | None) -> dict[str, Any] | None:
    """A completion's logprobs (tokens, token_logprobs, top_logprobs) in the chat shape."""
    if logprobs is None:
        return None
    content = []
    for token, lp, tops in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=False):
        content.append({"token": token, "bytes": None, "logprob": lp,
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in (tops or {}).items()]})
    return {"content": content, "refusal": None}


def _completion_to_chat(c: dict[str, Any]) -> dict[str, Any]:
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                         "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}],
            "usage": c["usage"]}


def _chunk(c: dict[str, Any], delta: dict[str, Any], logprobs: Any, finish: str | None) -> dict[str, Any]:
    return {"id": "chat" + c["id"], "model": c["model"], "created": c["created"], "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


def _chunks_to_chat(chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The completion's chunks as chat chunks: a first one with the assistant role, then the text."""
    for i, c in enumerate(chunks):
        ch = c["choices"][0]
        if i == 0:
            yield _chunk(c, {"role": "assistant"}, None, None)
        delta = {"content": ch["text"]} if ch["finish_reason"] is None else {}
        yield _chunk(c, delta, _chat_logprobs(ch["logprobs"]), ch["finish_reason"])


def _tool_call(name: str, args: str, call_id: str, index: int | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return call if index is None else {"index": index, **call}


def _completion_to_tool_call(name: str, c: dict[str, Any]) -> dict[str, Any]:
    """A forced tool's completion (its JSON arguments) as an assistant message with one tool call."""
    ch = c["choices"][0]
    args = ch["text"]
    message = {"role": "assistant", "content": None, "function_call": {"name": name, "arguments": args},
               "tool_calls": [_tool_call(name, args, f"call__0_{name}_{c['id']}")]}
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": message, "logprobs": _chat_logprobs(ch["logprobs"]),
                         "finish_reason": "tool_calls"}], "usage": c["usage"]}


def _chunks_to_tool_call(name: str, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A forced tool's stream: an empty assistant delta, the arguments piece by piece, then tool_calls."""
    first = None
    for c in chunks:
        ch = c["choices"][0]
        if first is None:
            first = c
            yield {**_chunk(c, {"role": "assistant", "content": None, "function_call": None, "tool_calls": None},
                            None, None), "object": "chat.completion.chunk"}
        call_id = f"call__0_{name}_{first['id']}"
        yield _chunk(c, {"role": None, "content": None, "function_call": {"name": name, "arguments": ch["text"]},
                         "tool_calls": [_tool_call(name, ch["text"], call_id, 0)]},
                     _chat_logprobs(ch["logprobs"]), None)
    if first is not None:
        yield _chunk(first, {"role": None, "content": None, "function_call": None, "tool_calls": None}, None,
                     "tool_calls")


# ---------------------------------------------------------------------- chat_format="chatml-function-calling"
_FC_INSTRUCTIONS = (
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', "
    "use the following format:"
    "\n\nfunctions.<function_name>:\n{ \"arg1\": \"value1\", \"arg2\": \"value2\" }"
    "\nfunctions.<function_name>:\n{ \"arg1\": \"value1\", \"arg2\": \"value2\" }")


def _fc_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]], with_tools: bool) -> str:
    """llama-cpp-python's ChatML function-calling prompt, as its template renders it: texts HTML-escaped
    (the template autoescapes), parameter schemas as jinja's ``tojson`` writes them (sorted keys, HTML-safe),
    the tools listed in the system turn as ``functions.<name>:`` and the two reply forms explained."""
    esc = markupsafe.escape
    out: list[str] = []
    for m in messages:
        if "role" not in m:
            raise ValueError("every message needs a 'role'")
        role = m["role"]
        out.append(f"<|im_start|>{esc(role)}\n")
        if role == "system":
            out.append(str(esc(m["content"])))
            if with_tools:
                out.append("\n\nYou have access to the following functions:\n")
                for t in tools:
                    fn = t["function"]
                    out.append(f"\nfunctions.{esc(fn['name'])}:\n"
                               f"{htmlsafe_json_dumps(fn['parameters'], sort_keys=True)}\n")
                out.append(_FC_INSTRUCTIONS)
            out.append("<|im_end|>\n")
        elif role == "user":
            out.append(f"{esc(m['content'])}<|im_end|>\n")
        elif role == "assistant":
            content = m.get("content")
            if content:
                out.append(("message:\n" if with_tools else "") + f"{esc(content)}<|im_end|>\n")
            if "tool_calls" in m:
                for call in m["tool_calls"]:
                    out.append(f"functions.{esc(call['function']['name'])}:\n{esc(call['function']['arguments'])}")
                out.append("<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def _schema_grammar(schema: Any) -> LlamaGrammar:
    try:
        return LlamaGrammar.from_json_schema(schema)
    except Exception:
        return LlamaGrammar.from_string(JSON_GBNF)


def chatml_function_calling(*, llama: Llama, messages: list[dict[str, Any]],
                            functions: list[dict[str, Any]] | None = None, function_call: Any = None,
                            tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                            temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                            typical_p: float = 1.0, stream: bool = False, stop: str | list[str] | None = None,
                            response_format: dict[str, Any] | None = None, max_tokens: int | None = None,
                            presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                            repeat_penalty: float = 1.1, tfs_z: float = 1.0, mirostat_mode: int = 0,
                            mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                            logits_processor: Any = None, grammar: LlamaGrammar | None = None,
                            logprobs: bool | None = None, top_logprobs: int | None = None, **kwargs: Any) -> Any:
    """llama-cpp-python's ``chatml-function-calling`` handler (its documented function-calling example):
    ChatML with the tools described in the system turn; a named ``tool_choice`` appends
    ``functions.<name>:`` and constrains the arguments to the tool's schema; "auto" first lets the model
    choose between ``message:`` and ``functions.<name>:`` (greedily, under a grammar), then writes the
    message or the call. Without tools or with tool_choice None/"none" it is plain ChatML."""
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, dict) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    stop = [stop, "<|im_end|>"] if isinstance(stop, str) else [*stop, "<|im_end|>"] if stop else ["<|im_end|>"]
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "typical_p": typical_p,
                "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty,
                "repeat_penalty": repeat_penalty, "tfs_z": tfs_z, "mirostat_mode": mirostat_mode,
                "mirostat_tau": mirostat_tau, "mirostat_eta": mirostat_eta, "model": model,
                "logits_processor": logits_processor}
    if tool_choice is None or tool_choice == "none" or not tools:
        if response_format is not None and response_format.get("type") == "json_object":
            grammar = _response_format_grammar(response_format)
        out = llama.create_completion(prompt=_fc_prompt(messages, [], False), stream=stream, stop=stop,
                                      max_tokens=max_tokens, grammar=grammar,
                                      logprobs=top_logprobs if logprobs else None, **sampling)
        return _chunks_to_chat(out) if stream else _completion_to_chat(out)
    prompt = _fc_prompt(messages, tools, True)
    by_name = {t["function"]["name"]: t for t in tools}
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in by_name:
            raise ValueError(f"Tool with name '{name}' not found in tools")
        out = llama.create_completion(prompt=prompt + f"functions.{name}:\n", stream=stream, stop=stop,
                                      max_tokens=max_tokens,
                                      grammar=_schema_grammar(by_name[name]["function"]["parameters"]), **sampling)
        return _chunks_to_tool_call(name, out) if stream else _completion_to_tool_call(name, out)
    if tool_choice != "auto":
        raise ValueError(f"tool_choice must be None, 'none', 'auto' or a named function, got {tool_choice!r}")
    names = " | ".join(f'"functions.{t["function"]["name"]}:"' for t in tools)
    choose = LlamaGrammar.from_string(f'root ::= functions | "message:"\nfunctions ::= {names}\n')
    follow_up = LlamaGrammar.from_string(f'root ::= functions | "<|im_end|>"\nfunctions ::= {names}\n')
    first = llama.create_completion(prompt=prompt, stream=False, stop=[":"], max_tokens=None, grammar=choose,
                                    **{**sampling, "temperature": 0})
    text = first["choices"][0]["text"]
    if "message" in text:
        out = llama.create_completion(prompt=prompt + "message:\n", stream=stream, stop=["<|im_end|>"],
                                      logprobs=top_logprobs if logprobs else None, max_tokens=None,
                                      grammar=follow_up, **sampling)
        return _chunks_to_chat(out) if stream else _completion_to_chat(out)
    if stream:
        raise ValueError("Automatic streaming tool choice is not supported")
    name = text[len("functions."):]
    calls: list[tuple[str, dict[str, Any]]] = []
    while name in by_name:
        prompt += f"functions.{name}:\n"
        done = llama.create_completion(prompt=prompt, stream=False, stop=stop, max_tokens=None,
                                       grammar=_schema_grammar(by_name[name]["function"]["parameters"]), **sampling)
        calls.append((name, done))
        prompt += done["choices"][0]["text"] + "\n"
        nxt = llama.create_completion(prompt=prompt, stream=False, stop=stop, max_tokens=None, grammar=follow_up,
                                      **sampling)
        name = nxt["choices"][0]["text"][len("functions."):]  # "<name>:" with its colon: the loop ends here
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
        _tool_call(n, c["choices"][0]["text"], f"call__{i}_{n}_{c['id']}") for i, (n, c) in enumerate(calls)]}
    if len(calls) == 1:
        # the legacy field, as llama-cpp-python fills it: named after the text that ended the loop ("pick:",
        # with its colon); tool_calls hold the right name
        message["function_call"] = {"name": name, "arguments": calls[0][1]["choices"][0]["text"]}
    usage = {k: sum(c["usage"][k] for _, c in calls) for k in ("completion_tokens", "prompt_tokens", "total_tokens")}
    return {"id": "chat" + first["id"], "object": "chat.completion", "created": first["created"],
            "model": first["model"],
            "choices": [{"finish_reason": "tool_calls", "index": 0, "logprobs": _chat_logprobs(first["choices"][0]
                                                                                                ["logprobs"]),
                         "message": message}], "usage": usage}


#: llama-cpp-python's chat handlers by chat_format name (formats with logic beyond a prompt)
CHAT_HANDLERS: dict[str, Callable[..., Any]] = {"chatml-function-calling": chatml_function_calling}
