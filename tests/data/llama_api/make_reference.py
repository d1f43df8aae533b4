"""Run the examples of tests/helpers/llama_api_examples.py with llama-cpp-python and keep what they return.

Not run by the tests (tests/test_llama_api.py reads what this wrote). Needs llama.cpp 0c1e570's shared
libraries and the ctypes bindings of the llama-cpp-python 0.3.36 sdist (its ``Llama`` class, unchanged):

    PYTHONPATH=tests:src:<sdist>/llama_cpp_python-0.3.36:<pydeps> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/llama_api/make_reference.py [--qwen]

Writes ``grammars.json``: llama-cpp-python's GBNF for the schemas of ``ex.SCHEMAS`` and its JSON_GBNF
(the tests check that pyggml's grammars accept and refuse the same texts); ``tiny.json``: the tiny random
chat model of tests/helpers/chat_model.py (made here, deterministic bytes; its SHA-256 is kept so that a
changed model is noticed) and every example's result; with ``--qwen`` also ``qwen.json``, the packaged
Qwen2.5-Coder 0.5B Instruct Q4_K_M's examples.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp  # the sdist's package, over LLAMA_CPP_LIB_PATH's libllama
from llama_cpp import Llama, LlamaGrammar, LogitsProcessorList, StoppingCriteriaList
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from helpers import llama_api_examples as ex
from helpers.chat_model import make_chat_model

HERE = Path(__file__).resolve().parent
QWEN = Path.home() / ".cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


class Api:
    LlamaGrammar = LlamaGrammar
    LogitsProcessorList = LogitsProcessorList
    StoppingCriteriaList = StoppingCriteriaList


def run(examples: dict, path: Path) -> dict:
    make = ex.maker(Llama, str(path))
    out = {}
    for name, fn in examples.items():
        out[name] = fn(make, Api)
        print(f"{name}: done", file=sys.stderr)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    grammars = {"json_gbnf": JSON_GBNF,
                "schemas": {name: {"schema": schema, "gbnf": json_schema_to_gbnf(json.dumps(schema))}
                            for name, schema in ex.SCHEMAS.items()}}
    (HERE / "grammars.json").write_text(json.dumps(grammars, indent=1, ensure_ascii=False) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_chat_model(Path(tmp) / "tiny-chat.gguf")
        data = {"llama_cpp_python": llama_cpp.__version__, "model_sha256": sha256(model),
                "examples": run(ex.TINY_EXAMPLES, model), "encoder": ex.encoder_embeddings(Llama)}
    (HERE / "tiny.json").write_text(json.dumps(data, indent=1, ensure_ascii=False, default=float) + "\n")
    if "--qwen" in sys.argv:
        data = {"llama_cpp_python": llama_cpp.__version__, "model_sha256": sha256(QWEN),
                "examples": run(ex.QWEN_EXAMPLES, QWEN)}
        (HERE / "qwen.json").write_text(json.dumps(data, indent=1, ensure_ascii=False, default=float) + "\n")


if __name__ == "__main__":
    main()
