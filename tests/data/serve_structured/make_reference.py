"""Make llama_server_json_schema.json: llama-server's replies to json_schema chat requests at temperature 0.

The replies are what ``tests/serve/test_serve_tools.py`` expects ``pyggml serve`` to return for the same
requests on the same model (Qwen2.5-Coder 0.5B Instruct Q4_K_M, flash attention off on both sides:
the test passes -fa off). llama.cpp is not a dependency: this script ran once, with the llama-server of
llama.cpp commit 0c1e570, and its output is kept here.

    python tests/data/serve_structured/make_reference.py LLAMA_SERVER \
        ~/.cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

#: the requests (model names and streaming aside, exactly what the test sends)
REQUESTS = [
    {"messages": [{"role": "user", "content": "Give me a fictional person as JSON: name and age."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
         "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["name", "age"], "additionalProperties": False}}},
     "temperature": 0, "max_tokens": 60},
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "List three fruits with their colors."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "fruits", "schema": {
         "type": "object", "properties": {"fruits": {"type": "array", "minItems": 3, "maxItems": 3, "items": {
             "type": "object", "properties": {"fruit": {"type": "string"},
                                              "color": {"enum": ["red", "yellow", "green", "orange", "purple"]}},
             "required": ["fruit", "color"], "additionalProperties": False}}},
         "required": ["fruits"], "additionalProperties": False}}},
     "temperature": 0, "max_tokens": 120},
]


def main(server: str, model: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "-m", model, "-c", "4096", "-np", "1", "-fa", "off", "-t", "2",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        out = []
        for req in REQUESTS:
            r = httpx.post(url + "/v1/chat/completions", json=req, timeout=600)
            r.raise_for_status()
            choice = r.json()["choices"][0]
            out.append({"request": req, "content": choice["message"]["content"],
                        "finish_reason": choice["finish_reason"]})
    finally:
        proc.terminate()
        proc.wait(30)
    meta = {"made_by": "tests/data/serve_structured/make_reference.py", "llama.cpp": "0c1e570 llama-server -fa off",
            "model": Path(model).name, "cases": out}
    dest = Path(__file__).with_name("llama_server_json_schema.json")
    dest.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    print(dest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
