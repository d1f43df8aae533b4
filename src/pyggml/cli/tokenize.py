"""``pyggml tokenize -p TEXT [-m MODEL] [--ids] [--no-bos] [--parse-special]``: the tokens of a text.

Prints as llama-tokenize does: one line per token, ``%6d -> 'piece'`` (the piece's bytes as they are,
control tokens as their text), or with ``--ids`` the ids as one list (``[2, 9259]``, valid JSON).
BOS (and EOS) are added when the model asks for them unless ``--no-bos``; control tokens written in
the text (``<start_of_turn>``) are only recognised with ``--parse-special``. Without ``-m`` the
default Gemma 3 model is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..llm.packaged import resolve
from ..llm.tokenizer import Vocab


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("tokenize", help="print the tokens of a text (like llama-tokenize)",
                              description="Tokenize a text with a GGUF model's vocabulary and print each token "
                                          "id with its piece, or only the ids (--ids).")
    p.add_argument("-p", "--prompt", required=True, help="the text to tokenize")
    p.add_argument("-m", "--model", help="GGUF model file (default: the Gemma 3 270M model package)")
    p.add_argument("--ids", action="store_true", help="print only the ids, as one list: [2, 9259, ...]")
    p.add_argument("--show-count", action="store_true", help="also print the number of tokens")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS even if the model wants them")
    p.add_argument("--parse-special", action="store_true", help="turn special-token texts into those tokens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    vocab = Vocab.from_gguf(resolve(args.model))
    ids = vocab.tokenize(args.prompt, add_special=not args.no_bos, parse_special=args.parse_special)
    out = sys.stdout
    if args.ids:
        out.write(json.dumps(ids) + "\n")
    else:
        out.flush()
        raw = sys.stdout.buffer
        for t in ids:  # the piece's raw bytes, as llama-tokenize's printf writes them
            raw.write(f"{t:6d} -> '".encode() + vocab.token_to_piece(t, special=True) + b"'\n")
        raw.flush()
    if args.show_count:
        out.write(f"Total number of tokens: {len(ids)}\n")
    return 0
