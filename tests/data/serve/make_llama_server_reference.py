"""Record llama-server's replies (llama.cpp 0c1e570) for tests/serve/test_serve_endpoints.py.

Not run by the tests (they read ``llama_server_reference.json``, which this writes). Needs a llama.cpp
build with the llama-server target (LLAMA_SERVER, default /work/lc/llama.cpp/build/bin/llama-server):

    PYTHONPATH=src:tests python tests/data/serve/make_llama_server_reference.py

Two servers, both with flash attention off (the tests start pyggml serve with -fa off) and one thread:

* the tiny chat model of tests/helpers/chat_model.py (deterministic bytes), ``-c 1024 -np 2
  --slot-save-path DIR``: /completion (plain, mixed and several prompts, streamed, a stop word,
  logit_bias), /v1/completions and /v1/chat/completions with logprobs, ``n`` = 2, /props,
  /apply-template, /infill on a model without FIM tokens, and the slot actions;
* with ``--embedding -c 512 -np 2``: tests/data/archs' bert, nomic-bert and gemma-embedding models (their
  own pooling; bert also with ``--pooling none``) and the tiny chat model with ``--pooling last``:
  /v1/embeddings (float, base64, embd_normalize), /embedding and /embeddings, and their errors;
* the packaged Qwen2.5-Coder 0.5B Instruct Q4_K_M (when installed), ``-c 4096 -np 1 -b 512``: /infill at
  temperature 0, with and without repository chunks (``input_extra``) and a ``prompt``.

``llama_server_slot0.bin`` is the slot state file the tiny server saved (the tests restore it).
Timings, creation times and ids vary from run to run and are kept as they came; the tests compare the
fields that do not.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVER = os.environ.get("LLAMA_SERVER", "/work/lc/llama.cpp/build/bin/llama-server")
QWEN = Path.home() / ".cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

TINY_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("completion", "/completion", {"prompt": "hello world", "n_predict": 6, "temperature": 0, "n_probs": 3,
                                   "return_tokens": True}),
    ("completion_mixed", "/completion", {"prompt": ["hello", 101, " world"], "n_predict": 4, "temperature": 0}),
    ("completion_multi", "/completion", {"prompt": ["hello world", [1, 2, 3]], "n_predict": 3, "temperature": 0}),
    ("completion_n_cmpl", "/completion", {"prompt": ["hello world", "a cat"], "n_predict": 2, "temperature": 0,
                                          "n_cmpl": 2}),
    ("completion_stream", "/completion", {"prompt": "hello world", "n_predict": 4, "temperature": 0, "n_probs": 1,
                                          "stream": True}),
    ("completion_stream_timings", "/completion", {"prompt": "hello world", "n_predict": 3, "temperature": 0,
                                                  "stream": True, "timings_per_token": True}),
    ("completion_post_probs_greedy", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0,
                                                     "n_probs": 3, "post_sampling_probs": True}),
    ("completion_post_probs", "/completion", {"prompt": "hello world", "n_predict": 4, "temperature": 0.8,
                                              "seed": 3, "n_probs": 3, "post_sampling_probs": True}),
    ("completion_post_probs_topk", "/completion", {"prompt": "hello world", "n_predict": 4, "temperature": 0.8,
                                                   "top_k": 2, "seed": 3, "n_probs": 5, "post_sampling_probs": True}),
    ("completion_stop", "/completion", {"prompt": "hello world", "n_predict": 8, "temperature": 0, "stop": [" snake"]}),
    ("completion_bias", "/completion", {"prompt": "hello world", "n_predict": 3, "temperature": 0,
                                        "logit_bias": [[352, -100], ["hello", False]], "samplers": "kt"}),
    ("completion_bias_dict", "/completion", {"prompt": "hello world", "n_predict": 3, "temperature": 0,
                                             "logit_bias": {"352": -100.5, "14": 2}}),
    ("completion_cached", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0}),
    ("completion_no_cache", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0,
                                            "cache_prompt": False}),
    ("completion_ignore_eos", "/completion", {"prompt": "hello world", "n_predict": 3, "temperature": 0,
                                              "ignore_eos": True, "logit_bias": {"14": 1.5}}),
    ("v1_completions_logprobs", "/v1/completions", {"prompt": "hello world", "max_tokens": 4, "temperature": 0,
                                                    "logprobs": 2}),
    ("v1_completions_logprobs_stream", "/v1/completions", {"prompt": "hello world", "max_tokens": 3,
                                                           "temperature": 0, "logprobs": 2, "stream": True}),
    ("v1_chat_logprobs", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                  "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    ("v1_chat_logprobs_stream", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 3, "temperature": 0, "logprobs": True,
                                                         "top_logprobs": 2, "stream": True}),
    ("v1_completions_n2", "/v1/completions", {"prompt": "hello world", "max_tokens": 3, "temperature": 0, "n": 2}),
    ("v1_chat_n2", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                            "temperature": 0, "n": 2}),
    ("v1_completions_prompts_n2", "/v1/completions", {"prompt": ["hello world", "a cat"], "max_tokens": 3,
                                                      "temperature": 0, "n": 2}),
    ("v1_completions_n3", "/v1/completions", {"prompt": "hello world", "max_tokens": 3, "n": 3}),
    ("props", "/props", None),
    ("apply_template", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
    ("infill_no_fim", "/infill", {"input_prefix": "a", "input_suffix": "b"}),
    ("prime_slot0", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0, "id_slot": 0}),
    ("slot_save", "/slots/0?action=save", {"filename": "slot0.bin"}),
    ("slot_erase", "/slots/0?action=erase", {}),
    ("slot_restore", "/slots/0?action=restore", {"filename": "slot0.bin"}),
    ("slot_restore_missing", "/slots/0?action=restore", {"filename": "missing.bin"}),
    ("slot_bad_filename", "/slots/0?action=save", {"filename": "../x.bin"}),
    ("slot_bad_action", "/slots/0?action=frobnicate", {}),
    ("after_restore", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0, "id_slot": 0}),
    ("slot_restore_again", "/slots/0?action=restore", {"filename": "slot0.bin"}),
    ("after_restore_again", "/completion", {"prompt": "hello world", "n_predict": 2, "temperature": 0,
                                            "id_slot": 0}),
]

ARCHS = HERE.parent / "archs"
EMBD_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("v1_one", "/v1/embeddings", {"input": "hello world"}),
    ("v1_list_base64", "/v1/embeddings", {"input": ["hello world", "a cat sat", [5, 6, 7]],
                                          "encoding_format": "base64"}),
    ("v1_norm1", "/v1/embeddings", {"input": ["the quick fox"], "embd_normalize": 1}),
    ("native_content", "/embedding", {"content": "hello world"}),
    ("native_input_list", "/embeddings", {"input": ["hello", "world"]}),
    ("v1_bad_format", "/v1/embeddings", {"input": "x", "encoding_format": "int8"}),
    ("v1_missing", "/v1/embeddings", {"model": "x"}),
]
EMBD_NONE_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("native_none", "/embedding", {"content": "hello world"}),
    ("v1_none", "/v1/embeddings", {"input": "hello world"}),
]
TINY_EMBD_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("v1_last", "/v1/embeddings", {"input": ["hello world", "a cat"]}),
    ("completion", "/completion", {"prompt": "hello world", "n_predict": 3, "temperature": 0}),
]

FIB_PREFIX = "def fib(n):\n    "
FIB_SUFFIX = "\n    return fib(n - 1) + fib(n - 2)\n"
QWEN_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("infill_fib", "/infill", {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX, "n_predict": 12,
                               "temperature": 0, "return_tokens": True}),
    ("infill_extra", "/infill", {
        "input_prefix": "from .shapes import Circle\n\ndef total_area(shapes):\n    ",
        "input_suffix": "\n    return total\n",
        "input_extra": [{"filename": "shapes.py", "text": "class Circle:\n    def area(self):\n        "
                                                          "return 3.14159 * self.r ** 2\n"},
                        {"text": "# utilities\n"}],
        "prompt": "total", "n_predict": 12, "temperature": 0, "return_tokens": True}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: dict[str, Any] | None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    if body is not None and body.get("stream"):
        events = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
        return {"status": status, "events": [e if e == "[DONE]" else json.loads(e) for e in events]}
    return {"status": status, "body": json.loads(raw)}


def serve(model: Path, args: list[str], requests: list[tuple[str, str, dict[str, Any] | None]]) -> dict[str, Any]:
    port = free_port()
    cmd = [SERVER, "-m", str(model), "--port", str(port), "-fa", "off", "-t", "1", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if request(base + "/health", None)["status"] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        out = {}
        for name, path, body in requests:
            out[name] = {"path": path, "request": body, **request(base + path, body)}
        return out
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(30)


def main() -> int:
    from helpers.chat_model import make_chat_model

    out: dict[str, Any] = {"llama_cpp": "0c1e570", "server": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_chat_model(Path(tmp) / "tiny-chat.gguf")
        slots = Path(tmp) / "slots"
        slots.mkdir()
        out["tiny_args"] = ["-c", "1024", "-np", "2"]
        out["server"]["tiny"] = serve(tiny, [*out["tiny_args"], "--slot-save-path", str(slots) + "/"],
                                      TINY_REQUESTS)
        # the state file llama-server wrote (slot 0 after "hello world", 9 tokens): pyggml must restore it
        (HERE / "llama_server_slot0.bin").write_bytes((slots / "slot0.bin").read_bytes())
        out["embd_args"] = ["-c", "512", "-np", "2", "--embedding"]
        out["server"]["tiny_embd_last"] = serve(tiny, [*out["embd_args"], "--pooling", "last"], TINY_EMBD_REQUESTS)
    for arch in ("bert", "nomic-bert", "gemma-embedding"):
        out["server"][f"{arch}_embd"] = serve(ARCHS / f"{arch}.gguf", out["embd_args"], EMBD_REQUESTS)
    out["server"]["bert_embd_none"] = serve(ARCHS / "bert.gguf", [*out["embd_args"], "--pooling", "none"],
                                            EMBD_NONE_REQUESTS)
    if QWEN.exists():
        out["qwen_args"] = ["-c", "4096", "-np", "1", "-b", "512"]
        out["server"]["qwen"] = serve(QWEN, out["qwen_args"], QWEN_REQUESTS)
    (HERE / "llama_server_reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
