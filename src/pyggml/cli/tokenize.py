"""``pyggml tokenize -p TEXT [-m MODEL] [--no-bos] [--parse-special]``: token ids as a JSON list.

Like ``llama-tokenize --ids``: BOS (and EOS) are added when the model asks for them unless
``--no-bos``; control tokens written in the text (``<start_of_turn>``) are only recognised
with ``--parse-special``. Without ``-m`` the default Gemma 3 model is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..llm.models import default_model_path
from ..llm.vocab import Vocab


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("tokenize", help="print the token ids of a text as a JSON list")
    p.add_argument("-p", "--prompt", required=True, help="the text to tokenize")
    p.add_argument("-m", "--model", help="GGUF model file (default: the Gemma 3 270M model package)")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS even if the model wants them")
    p.add_argument("--parse-special", action="store_true", help="turn special-token texts into those tokens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    vocab = Vocab.from_gguf(args.model if args.model else default_model_path())
    ids = vocab.tokenize(args.prompt, add_special=not args.no_bos, parse_special=args.parse_special)
    sys.stdout.write(json.dumps(ids) + "\n")
    return 0
