"""Speculative decoding speed: tokens/s of plain greedy generation against speculative greedy generation
(n-gram lookup, a draft model), on code prompts, and against llama.cpp's llama-speculative on the same pair.

Every speculative run's text is checked to equal the plain run's (greedy: it must). The modes run
interleaved, round after round, and the medians are printed with the command that made them.
Generation speed is Timings.tg_rate: generated tokens over generation seconds (the prompt, and for a
draft model its prompt pass too, are left out, as llama-speculative's "decoded ... t/s" leaves them out).

    python bench/speculative.py                                   # the 0.5B coder: plain, ngram, self-draft
    python bench/speculative.py -m TARGET.gguf -md DRAFT.gguf     # a target and its draft model
    python bench/speculative.py --llama-speculative /work/lc/llama.cpp/build/bin/llama-speculative

Modes: ``plain``, ``ngram`` (--spec-type ngram-simple with --ngram-n/--ngram-m), ``draft`` (-md, or the
target drafting for itself when -md is not given: an upper bound on acceptance, every draft accepted), and
``ngram+draft`` (--spec-type ngram-simple,draft-simple: a lookup's draft where it finds one, else the model's).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.generate import generate
from pyggml.llm.model import Model
from pyggml.llm.sampling import Sampler, SamplingParams
from pyggml.llm.speculative import ModelDrafter, NgramDrafter, Speculator, check_vocab_compatible
from pyggml.llm.tokenizer import Vocab

QWEN_05B = Path.home() / ".cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

FUNCTION = '''def summarize(items, weights=None):
    """Return the weighted mean, minimum and maximum of items."""
    if not items:
        raise ValueError("items must not be empty")
    if weights is None:
        weights = [1.0] * len(items)
    if len(weights) != len(items):
        raise ValueError("items and weights differ in length")
    total = 0.0
    weight_sum = 0.0
    for item, weight in zip(items, weights):
        total += item * weight
        weight_sum += weight
    smallest = min(items)
    largest = max(items)
    return {"mean": total / weight_sum, "min": smallest, "max": largest, "count": len(items)}
'''

CLASS = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise KeyError(name)
        self.items[name] -= count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
'''

#: code prompts whose answers repeat much of the prompt (what n-gram lookup is for) and one that does not
PROMPTS = {
    "rename": "Rewrite this Python function with `items` renamed to `values` and `total` renamed to `acc`. "
              f"Keep everything else exactly the same.\n\n```python\n{FUNCTION}```",
    "typehints": f"Add type hints to every method of this class. Change nothing else.\n\n```python\n{CLASS}```",
    "write": "Write a Python function that parses a CSV file of (name, score) rows and returns the three best "
             "names, with a docstring and error handling.",
}


def chat(text: str) -> str:
    return (f"<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
            "<|im_start|>assistant\n")


def run_pyggml(ctx: LlamaContext, vocab: Vocab, prompt: list[int], n: int, drafters: list | None,
               pad_to: int) -> tuple[list[int], float, str]:
    ctx.clear()
    for d in drafters or []:
        if isinstance(d, ModelDrafter):
            d.ctx.clear()
            d.cached.clear()
    spec = Speculator(ctx, drafters, pad_to=pad_to) if drafters else None
    out = generate(ctx, vocab, prompt, Sampler(SamplingParams(temp=0.0)), n, speculator=spec)
    return out.tokens, out.timings.tg_rate, spec.stats.summary() if spec else ""


def run_llama_speculative(binary: str, target: str, draft: str, prompt: str, n: int, threads: int,
                          n_max: int) -> tuple[float, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    cmd = [binary, "-m", target, "-md", draft, "-f", f.name, "-n", str(n), "--temp", "0", "-t", str(threads),
           "-td", str(threads), "-c", "2048", "--spec-draft-n-max", str(n_max), "-ngl", "0", "-ngld", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    os.unlink(f.name)
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", r.stderr)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"llama-speculative failed ({r.returncode}): {r.stderr[-800:]}")
    return float(m.group(3)), shlex.join(cmd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(QWEN_05B), help="target model (default: the packaged 0.5B coder)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft model (default: the target drafts for itself)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate per run (default 128)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; medians are printed (default 2)")
    ap.add_argument("--prompts", default="rename,typehints,write", help=f"of {', '.join(PROMPTS)}")
    ap.add_argument("--modes", default="plain,ngram,draft",
                    help="of plain, ngram (or ngram-N-M: size_n N, size_m M), draft (or draft-N-P: at most N "
                         "tokens, p_min P), and ngram+draft (an n-gram draft where the lookup finds one, else the "
                         "draft model's) (default: plain,ngram,draft)")
    ap.add_argument("--draft-max", type=int, default=3, help="draft model tokens per step (default 3)")
    ap.add_argument("--draft-p-min", type=float, default=0.0,
                    help="the draft model stops below this top-token probability (--spec-draft-p-min, default 0)")
    ap.add_argument("--ngram-n", type=int, default=4, help="ngram-simple size_n (default 4)")
    ap.add_argument("--ngram-m", type=int, default=8, help="ngram-simple size_m (default 8)")
    ap.add_argument("--pad", type=int, default=-1,
                    help="pad drafts to this length (Speculator pad_to; -1: the mode's draft length, 0: off)")
    ap.add_argument("--llama-speculative", default=None, help="llama-speculative binary: also time it on the pair")
    args = ap.parse_args()
    print(f"# {shlex.join([sys.executable, *sys.argv])}\n# CPU: {cpu_name()}, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    cparams = ContextParams(n_ctx=2048, n_threads=args.threads)
    model = Model(args.model, progress=False)
    vocab = Vocab.from_metadata(model.reader)
    ctx = LlamaContext(model, cparams)
    draft_path = args.model_draft or args.model
    draft_model = model if args.model_draft is None else Model(draft_path, progress=False)
    check_vocab_compatible(vocab, Vocab.from_metadata(draft_model.reader))
    draft_ctx = LlamaContext(draft_model, cparams)
    modes = args.modes.split(",")

    def drafters(mode: str) -> tuple[list | None, int]:
        out, pad = [], 0
        for part in mode.split("+"):  # ngram+draft: both, in llama.cpp's order (a lookup first, else the model)
            if part.startswith("ngram"):  # ngram, or ngram-N-M for another size_n and size_m than the flags'
                n, m = (int(v) for v in part.split("-")[1:]) if "-" in part else (args.ngram_n, args.ngram_m)
                out.append(NgramDrafter(n, m))
                pad = max(pad, m)
            elif part.startswith("draft"):  # draft, or draft-N[-P]: at most N tokens, stopping below p_min P
                n_max, p_min = args.draft_max, args.draft_p_min
                if "-" in part:
                    n_max, *rest = part.split("-")[1:]
                    n_max, p_min = int(n_max), float(rest[0]) if rest else p_min
                out.append(ModelDrafter(draft_ctx, n_max, p_min=p_min))
                pad = max(pad, n_max)
            elif part != "plain":
                raise SystemExit(f"unknown mode {part!r}")
        return out or None, pad if args.pad < 0 else args.pad

    prompts = {name: vocab.tokenize(chat(PROMPTS[name]), add_special=True, parse_special=True)
               for name in args.prompts.split(",")}
    rates: dict[tuple[str, str], list[float]] = {}
    notes: dict[tuple[str, str], str] = {}
    for toks in prompts.values():  # warm-up: kernels compiled, graphs of every shape met once
        for mode in modes:
            run_pyggml(ctx, vocab, toks, 8, *drafters(mode))
    for _ in range(args.rounds):
        for name, toks in prompts.items():
            ref = None
            for mode in modes:
                tokens, rate, note = run_pyggml(ctx, vocab, toks, args.n, *drafters(mode))
                if ref is None:
                    ref = tokens
                elif tokens != ref:
                    raise SystemExit(f"{name}/{mode}: the speculative text differs from {modes[0]}'s")
                rates.setdefault((name, mode), []).append(rate)
                notes[(name, mode)] = note
                print(f"  {name:10s} {mode:6s} {rate:6.2f} tok/s  {note}", flush=True)
    print(f"\n| prompt | mode | tok/s (median of {args.rounds}) | vs plain | drafts |\n|---|---|---|---|---|")
    for name in prompts:
        base = statistics.median(rates[(name, "plain")]) if "plain" in modes else None
        for mode in modes:
            r = statistics.median(rates[(name, mode)])
            ratio = f"{r / base:.2f}x" if base else "-"
            note = notes[(name, mode)].split("; ", 1)[0].removeprefix("speculative: ")
            print(f"| {name} | {mode} | {r:.2f} | {ratio} | {note} |")
    if args.llama_speculative and "draft" in modes:
        print("\nllama-speculative on the same pair (greedy, same draft length):")
        for name in prompts:
            ours = statistics.median(rates[(name, "draft")])
            theirs, cmd = run_llama_speculative(args.llama_speculative, args.model, draft_path, chat(PROMPTS[name]),
                                                args.n, args.threads, args.draft_max)
            print(f"| {name} | pyggml {ours:.2f} tok/s | llama-speculative {theirs:.2f} tok/s | "
                  f"{ours / theirs:.2f}x |\n  # {cmd}")
    return 0


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
