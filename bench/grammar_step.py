"""Cost of a grammar-constrained decode step against an unconstrained one (issue #30: at most +10%).

    python bench/grammar_step.py [-m MODEL] [-n TOKENS]

For the default Gemma 3 270M (and the packaged Qwen2.5-Coder chat model when installed), generates
greedily after the same prompt: unconstrained (-n tokens, end-of-generation ignored), then under a
JSON schema, a GBNF JSON grammar and a list grammar. Prints ms per generated token for each, the
sampling time per token (the chain plus the grammar check, accept and any full-vocabulary filter)
and the grammar's part of it as a share of an unconstrained step (the wall-clock difference between
runs is mostly noise on a busy machine; the sampling time is what the grammar adds), how often a
refused token made it resample (best_allowed / the full-vocabulary filter, as llama.cpp's
resampling), and the one-off cost of decoding the vocabulary for the filter.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.generate import generate
from pyggml.llm.grammar import GrammarSampler, vocab_table
from pyggml.llm.grammar.json_schema import json_schema_to_grammar
from pyggml.llm.model import Model
from pyggml.llm.packaged import CHAT_MODEL, DEFAULT_MODEL_PACKAGE, resolve
from pyggml.llm.sampling import Sampler, SamplingParams
from pyggml.llm.tokenizer import Vocab

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
    "required": ["name", "age", "email", "tags"], "additionalProperties": False}
JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
'''
LIST_GBNF = 'root ::= ("- " [^\\r\\n]+ "\\n"){3,6}\n'
PERSON = "Write a JSON record for a person named Ann:"
#: (name, grammar, prompt, temperature): greedy, and one sampled case (a refused token is resampled
#: through the filter over the whole vocabulary there, not the greedy scan of the best tokens)
CASES = [("unconstrained", None, PERSON, 0.0),
         ("json-schema", json_schema_to_grammar(SCHEMA), PERSON, 0.0),
         ("json.gbnf", JSON_GBNF, PERSON, 0.0),
         ("list", LIST_GBNF, "Shopping list:\n", 0.0),
         ("unconstrained t=.8", None, PERSON, 0.8),
         ("json-schema t=.8", json_schema_to_grammar(SCHEMA), PERSON, 0.8)]


class TimedSampler(Sampler):
    """Times sample() and accept() (the grammar's share of a step) and counts refusals."""

    def __init__(self, params: SamplingParams, grammar: GrammarSampler | None) -> None:
        super().__init__(params, grammar=grammar)
        self.t_sample = 0.0
        self.n_refused = 0
        if grammar is not None:  # a refused token resamples through one of these two
            for name in ("best_allowed", "apply"):
                setattr(grammar, name, self._counting(getattr(grammar, name)))

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n_refused += 1
            return fn(*args, **kwargs)
        return counted

    def sample(self, logits: np.ndarray) -> int:
        t = time.perf_counter()
        tok = super().sample(logits)
        self.t_sample += time.perf_counter() - t
        return tok

    def accept(self, token: int, is_generated: bool = True) -> None:
        t = time.perf_counter()
        super().accept(token, is_generated)
        if is_generated:
            self.t_sample += time.perf_counter() - t


def bench_model(path: Path, n: int) -> None:
    model = Model(path, progress=False)
    vocab = Vocab.from_metadata(model.reader)
    t = time.perf_counter()
    vocab_table(vocab)
    print(f"\n{path.name}: vocabulary {vocab.n_tokens} tokens, decoded for the grammar filter in "
          f"{time.perf_counter() - t:.2f} s (once per vocabulary)")
    ctx = LlamaContext(model, ContextParams(n_ctx=1024))
    prompt = vocab.tokenize("warm up", add_special=True, parse_special=True)
    generate(ctx, vocab, prompt, Sampler(SamplingParams(temp=0.0)), 4)  # compile the kernels first
    base: dict[float, tuple[float, float]] = {}  # temperature -> the unconstrained (ms/token, sampling ms/token)
    for name, grammar, text, temp in CASES:
        ctx.seq_rm(0, 0)
        g = GrammarSampler(vocab, grammar) if grammar else None
        s = TimedSampler(SamplingParams(temp=temp, seed=1), g)
        tokens = vocab.tokenize(text, add_special=True, parse_special=True)
        out = generate(ctx, vocab, tokens, s, n, ignore_eos=g is None)
        n_gen = max(out.timings.n_gen, 1)
        per_tok = out.timings.t_gen / n_gen * 1e3
        samp = s.t_sample / n_gen * 1e3
        if g is None:
            base[temp] = (per_tok, samp)
        step, step_samp = base[temp]
        print(f"  {name:18s} {n_gen:4d} tokens  {per_tok:7.2f} ms/token ({per_tok / step * 100 - 100:+5.1f}% wall)  "
              f"sampling {samp:6.3f} ms/token (grammar: {(samp - step_samp) / step * 100:+5.2f}% of a step)  "
              f"resampling calls {s.n_refused:3d}  stop {out.stop_reason}")
        if g is not None:
            print(f"  {'':18s} output: {out.text[:90]!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", default=None, help="GGUF model(s) (default: Gemma, + chat model)")
    ap.add_argument("-n", type=int, default=64, help="tokens per generation (default 64)")
    args = ap.parse_args()
    paths = [Path(p) for p in args.model] if args.model else [resolve(None, DEFAULT_MODEL_PACKAGE)]
    if not args.model:
        try:
            paths.append(resolve(None, CHAT_MODEL))
        except Exception as e:  # not installed: say so, bench the rest
            print(f"(chat model skipped: {e})")
    for p in paths:
        bench_model(p, args.n)


if __name__ == "__main__":
    main()
