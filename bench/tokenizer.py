"""Tokenizer speed on the default model's 262144-token vocabulary: load time and characters/s.

    python -P bench/tokenizer.py [-m MODEL] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pyggml.llm.packaged import default_model_path
from pyggml.llm.tokenizer import Vocab

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "gemma3"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--repeat", type=int, default=50, help="copies of the reference texts tokenized at once")
    args = ap.parse_args()
    path = args.model or default_model_path()
    t0 = time.perf_counter()
    vocab = Vocab.from_gguf(path)
    load = time.perf_counter() - t0
    ref = json.loads((DATA / "reference.json").read_text())  # llama.cpp's tokenizations of these texts
    text = " ".join(c["text"] for c in ref["tokenize"] + ref["prompts"]) * args.repeat
    t0 = time.perf_counter()
    ids = vocab.tokenize(text)
    dt = time.perf_counter() - t0
    t0 = time.perf_counter()
    vocab.detokenize(ids, remove_special=True)
    dt2 = time.perf_counter() - t0
    print(f"vocab load: {load:.2f} s")
    print(f"tokenize: {len(text)} chars -> {len(ids)} tokens in {dt * 1e3:.1f} ms ({len(text) / dt:,.0f} chars/s)")
    print(f"detokenize: {dt2 * 1e3:.1f} ms ({len(ids) / dt2:,.0f} tokens/s)")


if __name__ == "__main__":
    main()
