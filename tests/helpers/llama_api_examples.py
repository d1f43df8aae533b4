"""Code in the style of llama-cpp-python's documented examples, run against either implementation.

Each example takes ``make`` (``make(**kwargs)`` gives a ``Llama`` over the model under test, the same
object for the same arguments) and ``api`` (the module-like namespace with ``LlamaGrammar``,
``LogitsProcessorList``, ``StoppingCriteriaList``) and returns what the example prints, as JSON-able
data. tests/data/llama_api/make_reference.py runs them with llama-cpp-python over llama.cpp and
keeps the results; tests/test_llama_api.py runs them with pyggml and compares: greedy text token for
token, floats (log-probabilities, embeddings) to a tolerance.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the context every example asks for, on both sides: same n_ctx and n_batch, flash attention off,
#: F16 KV cache (both defaults), so the two compute the same numbers
CTX = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "flash_attn": False, "verbose": False, "seed": 1337}

Make = Callable[..., Any]


def _strip(resp: dict[str, Any]) -> dict[str, Any]:
    """A response without what differs between runs (id, created, the model's path), which are checked
    for their shape instead."""
    out = {k: v for k, v in resp.items() if k not in ("id", "created", "model")}
    out["id_prefix"] = resp["id"].split("-")[0]
    out["has_created"] = isinstance(resp.get("created"), int)
    return out


def _stream(chunks: Any) -> list[dict[str, Any]]:
    return [_strip(c) for c in chunks]


def completion(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    output = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\n"], echo=True,
                 temperature=0)
    return _strip(output)


def completion_tokens(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return _strip(llm.create_completion(llm.tokenize(b"Hello world"), max_tokens=12, temperature=0))


def streaming(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    full = llm("Once upon a time", max_tokens=24, temperature=0)["choices"][0]["text"]
    stop = full[6:9]  # a stop string the greedy text meets, so the stream must hold it back
    return {"stop": stop,
            "plain": _stream(llm("Once upon a time", max_tokens=24, temperature=0, stream=True)),
            "stopped": _stream(llm("Once upon a time", max_tokens=24, temperature=0, stream=True, stop=[stop]))}


def chat(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return _strip(llm.create_chat_completion(
        messages=[{"role": "system", "content": "You are an assistant who perfectly describes images."},
                  {"role": "user", "content": "Describe this image in detail please."}],
        temperature=0, max_tokens=24))


def chat_streaming(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return _stream(llm.create_chat_completion(messages=[{"role": "user", "content": "Tell me a story"}],
                                              temperature=0, max_tokens=20, stream=True))


def json_mode(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return _strip(llm.create_chat_completion(
        messages=[{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
                  {"role": "user", "content": "Who won the world series in 2020"}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=40))


def json_schema_mode(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    schema = {"type": "object", "properties": {"team": {"type": "string", "maxLength": 12}, "year": {"type": "integer"},
                                               "players": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                                               "home": {"type": "boolean"}},
              "required": ["team", "year"]}
    return _strip(llm.create_chat_completion(
        messages=[{"role": "user", "content": "Who won the world series in 2020"}],
        response_format={"type": "json_object", "schema": schema}, temperature=0, max_tokens=48))


def chat_formats(make: Make, api: Any) -> Any:
    out = {}
    for fmt in ("chatml", "llama-2", "llama-3", "gemma"):
        llm = make(**CTX, chat_format=fmt)
        out[fmt] = _strip(llm.create_chat_completion(
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                      {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "How are you?"}],
            temperature=0, max_tokens=8))
    return out


def grammar(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    g = api.LlamaGrammar.from_string('root ::= answer "."\nanswer ::= "yes" | "no" | [a-z]{2,8} (" " [a-z]{2,8}){0,3}')
    return _strip(llm("Is the sky blue? Answer: ", grammar=g, max_tokens=24, temperature=0))


def embeddings(make: Make, api: Any) -> Any:
    per_token = make(**CTX, embedding=True)
    mean = make(**CTX, embedding=True, pooling_type=1)  # LLAMA_POOLING_TYPE_MEAN
    resp = per_token.create_embedding("Hello, world!")
    return {"per_token": {**{k: v for k, v in resp.items() if k != "model"}},
            "pooling": per_token.pooling_type(),
            "mean": mean.embed(["Hello, world!", "Goodbye", "A third, longer text to embed"], normalize=True),
            "mean_one": mean.embed("Hello, world!")}


def save_load_state(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    first = llm("The quick brown fox", max_tokens=8, temperature=0)["choices"][0]["text"]
    state = llm.save_state()
    other = llm("Another prompt entirely", max_tokens=8, temperature=0)["choices"][0]["text"]
    llm.load_state(state)
    n_after_load = llm.n_tokens
    again = llm("The quick brown fox", max_tokens=8, temperature=0)["choices"][0]["text"]
    return {"first": first, "other": other, "again": again, "state_n_tokens": state.n_tokens,
            "n_after_load": n_after_load}


def generate(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    tokens = llm.tokenize(b"Hello")
    out = []
    for token in llm.generate(tokens, top_k=40, top_p=0.95, temp=0, repeat_penalty=1.1):
        out.append(token)
        if len(out) == 10:
            break
    return {"tokens": out, "text": llm.detokenize(out).decode("utf-8", errors="replace")}


def eval_sample(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    llm.reset()
    llm.eval(llm.tokenize(b"The capital of France is"))
    first = llm.sample(temp=0)
    llm.eval([first])
    return {"tokens": [first, llm.sample(temp=0)], "n_tokens": llm.n_tokens}


def penalties(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return _strip(llm("Once upon a time", max_tokens=24, temperature=0, repeat_penalty=1.5, frequency_penalty=0.5,
                      presence_penalty=0.5))


def logit_bias(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    plain = llm("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
    banned = llm.tokenize(plain.encode("utf-8"), add_bos=False)[:1]
    biased = llm("Once upon a time", max_tokens=6, temperature=0, logit_bias={banned[0]: -100.0, 300: 2.5})
    return {"banned": banned, "biased": _strip(biased)}


def sampling_seeded(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    return {"chain": _strip(llm("Hello", max_tokens=16, temperature=0.8, seed=1234)),
            "mirostat": _strip(llm("Hello", max_tokens=16, temperature=0.8, seed=7, mirostat_mode=2))}


def logprobs(make: Make, api: Any) -> Any:
    llm = make(**CTX, logits_all=True)
    return {"plain": _strip(llm("Hello world", max_tokens=6, temperature=0, logprobs=3)),
            "echo": _strip(llm("Hello world", max_tokens=4, temperature=0, logprobs=2, echo=True)),
            "stream": _stream(llm("Hello world", max_tokens=4, temperature=0, logprobs=2, stream=True)),
            "chat": _strip(llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], logprobs=True,
                                                      top_logprobs=2, max_tokens=3, temperature=0))}


def tokens(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    text = b"Hello <|im_end|> world"
    return {"plain": llm.tokenize(text), "special": llm.tokenize(text, special=True),
            "no_bos": llm.tokenize(text, add_bos=False),
            "detok": llm.detokenize(llm.tokenize(text, special=True)).decode("utf-8"),
            "detok_special": llm.detokenize(llm.tokenize(text, special=True), special=True).decode("utf-8"),
            "encode": llm.tokenizer().encode("Hello <|im_end|> world"),
            "decode": llm.tokenizer().decode(llm.tokenize(text, special=True)),
            "n_ctx": llm.n_ctx(), "n_vocab": llm.n_vocab(), "n_embd": llm.n_embd(),
            "bos": llm.token_bos(), "eos": llm.token_eos()}


def processors(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    n_prompt = len(llm.tokenize(b"Once upon a time"))

    def ban_low_ids(input_ids: Any, scores: Any) -> Any:
        scores[:100] = -float("inf")
        return scores

    def long_enough(input_ids: Any, logits: Any) -> bool:
        return len(input_ids) >= n_prompt + 5

    out = llm("Once upon a time", max_tokens=24, temperature=0,
              logits_processor=api.LogitsProcessorList([ban_low_ids]),
              stopping_criteria=api.StoppingCriteriaList([long_enough]))
    return _strip(out)


def forced_tool(make: Make, api: Any) -> Any:
    llm = make(**CTX)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Tokyo"]}},
                       "required": ["city"]}}}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    resp = llm.create_chat_completion(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                      tools=tools, tool_choice=choice,
                                      temperature=0, max_tokens=24)
    resp = _strip(resp)
    call = resp["choices"][0]["message"]["tool_calls"][0]
    call["id"] = call["id"].split("_cmpl-")[0]  # call__0_<name>_<completion id>
    return {"resp": resp, "arguments": json.loads(resp["choices"][0]["message"]["function_call"]["arguments"])}


FC_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
             "detailed, and polite answers to the user's questions. The assistant calls functions with appropriate "
             "input when necessary")
USER_DETAIL = {"type": "function", "function": {"name": "UserDetail", "parameters": {
    "type": "object", "title": "UserDetail", "properties": {"name": {"title": "Name", "type": "string"},
                                                            "age": {"title": "Age", "type": "integer"}},
    "required": ["name", "age"]}}}


def function_calling(make: Make, api: Any) -> Any:
    """chat_format="chatml-function-calling": a named tool, "auto", and no tools (its prompt escapes HTML)."""
    llm = make(**{**CTX, "n_ctx": 1024}, chat_format="chatml-function-calling")
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "n": {"enum": [1, 2]}},
        "required": ["colour", "n"]}}}]  # arguments the random model cannot make endless
    msgs = [{"role": "system", "content": FC_SYSTEM}, {"role": "user", "content": "Pick a colour & a number <now>"}]
    named = llm.create_chat_completion(messages=msgs, tools=tools, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "pick"}})
    auto = llm.create_chat_completion(messages=msgs, tools=tools, tool_choice="auto", temperature=0)
    first = llm.tokenize(b"functions", add_bos=False)[0]

    def prefer_calls(input_ids: Any, scores: Any) -> Any:  # "auto" then chooses a call over a message
        scores[first] += 50.0
        return scores

    auto_call = llm.create_chat_completion(messages=msgs, tools=tools, tool_choice="auto", temperature=0,
                                           logits_processor=api.LogitsProcessorList([prefer_calls]))
    plain = llm.create_chat_completion(messages=[{"role": "user", "content": "Say 'hi' & <b>bye</b>"}], temperature=0,
                                       max_tokens=8)
    out = {}
    for key, resp in (("named", named), ("auto", auto), ("auto_call", auto_call), ("plain", plain)):
        resp = _strip(resp)
        for call in resp["choices"][0]["message"].get("tool_calls") or []:
            call["id"] = call["id"].split("_cmpl-")[0]
        out[key] = resp
    return out


#: the examples on the tiny random chat model (tests/helpers/chat_model.py)
TINY_EXAMPLES: dict[str, Callable[[Make, Any], Any]] = {
    f.__name__: f for f in (completion, completion_tokens, streaming, chat, chat_streaming, json_mode, json_schema_mode,
                            chat_formats, function_calling, grammar,
                            embeddings, save_load_state, generate, eval_sample, penalties, logit_bias,
                            sampling_seeded, logprobs, tokens, processors, forced_tool)}


# ---------------------------------------------------------------------- on the packaged Qwen2.5-Coder 0.5B
QWEN_CTX = {"n_ctx": 512, "n_batch": 512, "flash_attn": False, "verbose": False}


def qwen_chat(make: Make, api: Any) -> Any:
    llm = make(**QWEN_CTX)
    return _strip(llm.create_chat_completion(
        messages=[{"role": "user", "content": "Write a Python function that returns the square of a number."}],
        temperature=0, max_tokens=24))


def qwen_json_schema(make: Make, api: Any) -> Any:
    llm = make(**QWEN_CTX)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    return _strip(llm.create_chat_completion(
        messages=[{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
                  {"role": "user", "content": "Make up a person: their name and age."}],
        response_format={"type": "json_object", "schema": schema}, temperature=0, max_tokens=24))


def qwen_stream(make: Make, api: Any) -> Any:
    llm = make(**QWEN_CTX)
    return _stream(llm("def fibonacci(n):", max_tokens=16, temperature=0, stream=True, stop=["\n\n"]))


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


def qwen_tools_auto(make: Make, api: Any) -> Any:
    """Tools with tool_choice "auto": the tools are rendered by Qwen's template, the reply is free (Qwen
    answers with the call as bare JSON here: llama-cpp-python leaves it as the content, pyggml reads it as
    a tool call)."""
    llm = make(**QWEN_CTX)
    resp = llm.create_chat_completion(messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
                                      tools=[WEATHER_TOOL], tool_choice="auto", temperature=0, max_tokens=40)
    return {"message": resp["choices"][0]["message"], "finish_reason": resp["choices"][0]["finish_reason"],
            "usage": resp["usage"]}


def qwen_function_calling(make: Make, api: Any) -> Any:
    """llama-cpp-python's documented function-calling example."""
    llm = make(**QWEN_CTX, chat_format="chatml-function-calling")
    resp = _strip(llm.create_chat_completion(
        messages=[{"role": "system", "content": FC_SYSTEM},
                  {"role": "user", "content": "Extract Jason is 25 years old"}],
        tools=[USER_DETAIL], tool_choice={"type": "function", "function": {"name": "UserDetail"}}, temperature=0))
    for call in resp["choices"][0]["message"]["tool_calls"]:
        call["id"] = call["id"].split("_cmpl-")[0]
    return resp


QWEN_EXAMPLES: dict[str, Callable[[Make, Any], Any]] = {
    f.__name__: f for f in (qwen_chat, qwen_json_schema, qwen_stream, qwen_tools_auto, qwen_function_calling)}


#: schemas whose grammars (llama-cpp-python's and pyggml's) must accept the same JSON texts
SCHEMAS: dict[str, Any] = {
    "object": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "tags": {"type": "array", "items": {"type": "string"}},
                                                "ok": {"type": "boolean"}, "score": {"type": "number"}},
               "required": ["name", "age"]},
    "bounded": {"type": "object", "properties": {"id": {"type": "string", "minLength": 2, "maxLength": 4},
                                                 "xs": {"type": "array", "items": {"type": "integer"},
                                                        "minItems": 1, "maxItems": 3}},
                "required": ["id", "xs"], "additionalProperties": False},
    "union": {"anyOf": [{"type": "null"}, {"enum": ["red", "green"]}, {"const": 7},
                        {"type": "string", "format": "date"}]},
    "refs": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                              "required": ["x"]}},
             "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
             "required": ["a"]},
    "free": {"type": "object", "additionalProperties": {"type": "integer"}},
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
}


ARCHS = Path(__file__).resolve().parents[1] / "data" / "archs"


def encoder_embeddings(llama_cls: Any) -> Any:
    """Embeddings of the tiny BERT (CLS pooling) and nomic-bert (mean pooling) models of tests/data/archs:
    non-causal encoders, several texts decoded together as sequences of one batch."""
    out = {}
    for name in ("bert", "nomic-bert"):
        llm = llama_cls(model_path=str(ARCHS / f"{name}.gguf"), embedding=True, n_ctx=128, n_batch=64, verbose=False)
        resp = llm.create_embedding("hello world")
        out[name] = {"pooling": llm.pooling_type(),
                     "embed": llm.embed(["hello world", "a second text here", "x"], normalize=True),
                     "create": {k: v for k, v in resp.items() if k != "model"}}
    return out


def maker(llama_cls: Any, path: str) -> Make:
    """``make(**kwargs)``: one ``llama_cls(model_path=path, **kwargs)`` per distinct set of arguments. A model
    made before is handed out reset (nothing evaluated, its seed as made), so that an example's result does
    not depend on which examples ran before it."""
    made: dict[str, Any] = {}

    def make(**kwargs: Any) -> Any:
        key = json.dumps(kwargs, sort_keys=True, default=repr)
        if key not in made:
            made[key] = llama_cls(model_path=path, **kwargs)
        llm = made[key]
        llm.reset()
        llm.set_seed(kwargs.get("seed", 0xFFFFFFFF))  # LLAMA_DEFAULT_SEED, the constructor's default
        return llm

    return make
