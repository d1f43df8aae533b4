"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered with jinja2, as llama.cpp does.

The context handed to the template is llama.cpp's: ``messages``, ``bos_token`` / ``eos_token`` (the
vocabulary's piece texts), ``add_generation_prompt``, plus the helpers Hugging Face templates call
(``raise_exception``, ``strftime_now``). After rendering, a leading BOS text is stripped when the
vocabulary adds BOS itself (common/chat.cpp), so tokenizing the result gives exactly one BOS.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import PyGGMLError
from ..gguf.constants import Keys

#: llama.cpp's fallback when a model has no template
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


#: Gemma's turn format (the Hugging Face gemma-3 template), used for models whose vocabulary has
#: Gemma's turn tokens but whose file carries no template (llama.cpp would fall back to ChatML)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
    "{% set messages = messages[1:] %}{% else %}{% set prefix = '' %}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


class ChatTemplateError(PyGGMLError):
    """The chat template failed to render (it raised, or the messages break its rules)."""


def _raise(msg: str) -> None:
    raise ChatTemplateError(f"chat template: {msg}")


class _GenerationTag(Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` (it marks the assistant's tokens for
    training masks; LFM2.5's template uses it): rendered as its body, as llama.cpp's jinja engine does."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "", add_bos: bool = False,
                 add_eos: bool = False) -> None:
        self.source = source if source and source != "chatml" else CHATML_TEMPLATE
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined,
                                            extensions=[_GenerationTag, "jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        env.filters["safe"] = str  # no escaping anywhere (llama.cpp's jinja): "x"|safe + text is plain text
        try:
            self._tpl = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from e
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **context: Any) -> str:
        """The prompt text; ``context`` adds template variables (``tools``, ``chat_template_kwargs`` such as
        ``enable_thinking``), which cannot replace the ones above."""
        try:
            text = self._tpl.render({**context, "messages": messages, "bos_token": self.bos_token,
                                     "eos_token": self.eos_token, "add_generation_prompt": add_generation_prompt})
        except ChatTemplateError:
            raise
        except Exception as e:  # a template bug or a message it rejects
            raise ChatTemplateError(f"chat template failed: {e}") from e
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, separators: Any = None,
            sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` (its keyword arguments too); a sequence a filter made lazily (``map``,
    ``select``) is written as the list it is."""
    def listed(obj: Any) -> Any:
        if isinstance(obj, Iterator):
            return list(obj)
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, default=listed,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys)


#: templates --chat-template takes by name (llama.cpp's built-in names for these formats)
BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}


class NoChatTemplateError(PyGGMLError):
    """The model carries no chat template: a base model, made to continue text rather than to chat."""


def template_for(reader: Any, vocab: Any, override: str | None = None) -> ChatTemplate:
    """The chat template of a model: ``override`` (a built-in name or jinja source) or its GGUF's.

    A model without one is refused rather than given a guessed format: base models (such as the
    default Gemma 3 270M) continue text and answer a chat turn with junk.
    """
    if override:
        src = BUILTIN_TEMPLATES.get(override.lower(), override)
    else:
        src = reader.get(Keys.TOKENIZER_CHAT_TEMPLATE, None)
    if not src:
        hint = " (it has Gemma's turn tokens: --chat-template gemma)" if _has_tokens(
            vocab, "<start_of_turn>", "<end_of_turn>") else ""
        raise NoChatTemplateError(
            "this model has no chat template (tokenizer.chat_template): it is a base model, made to continue "
            "text. Use `pyggml generate` with it, or chat with an instruct model (-m FILE), e.g. Qwen2.5-Coder "
            f"0.5B Instruct Q4_K_M; --chat-template NAME|JINJA forces a format{hint}")

    def piece(tok: int) -> str:
        return vocab.token_to_piece(tok, special=True).decode("utf-8", errors="replace") if tok >= 0 else ""

    return ChatTemplate(src, piece(vocab.bos), piece(vocab.eos), bool(vocab.add_bos), bool(vocab.add_eos))


def _has_tokens(vocab: Any, *texts: str) -> bool:
    try:
        return all(vocab.text_to_token(t) >= 0 for t in texts)
    except Exception:
        return False
