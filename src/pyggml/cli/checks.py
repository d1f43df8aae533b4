"""Flag values every command checks before it loads anything: one rule per flag, one place.

argparse checks types (an int flag given "abc"); these rules check ranges and files, so a bad
value is reported as one ``error:`` line naming the flag, before minutes of loading a model.
The rules follow llama.cpp's meanings (-1 = no limit for -n, 0 = the model's context for -c, ...).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from ..llm.packaged import is_registry_name

Rule = tuple[str, Callable[[object], bool], str]

_INT32 = 2**31 - 1


def _between(lo: float, hi: float) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int | float) and math.isfinite(v) and lo <= v <= hi


#: dest -> (flag as users write it, test, what a good value is)
RULES: dict[str, Rule] = {
    "ctx_size": ("-c/--ctx-size", _between(0, _INT32), "a token count >= 0 (0 = the model's training context)"),
    "batch_size": ("-b/--batch-size", _between(1, _INT32), "a token count >= 1"),
    "ubatch_size": ("-ub/--ubatch-size", _between(1, _INT32), "a token count >= 1"),
    "threads": ("-t/--threads", _between(0, 1024), "0 (all cores) to 1024"),
    "poll": ("--poll", _between(0, 100), "a polling level of 0 to 100"),
    "n_gpu_layers": ("-ngl/--n-gpu-layers", _between(-1, _INT32), "-1 (all) or a layer count >= 0"),
    "n_predict": ("-n/--n-predict", _between(-1, _INT32), "-1 (no limit) or a token count >= 0"),
    "keep": ("--keep", _between(-1, _INT32), "-1 (the whole prompt) or a token count >= 0"),
    "temp": ("--temp", _between(-math.inf, math.inf), "a finite number (<= 0: greedy)"),
    "top_k": ("--top-k", _between(0, _INT32), "a count >= 0 (0 = off)"),
    "top_p": ("--top-p", _between(0.0, 1.0), "a probability in [0, 1]"),
    "min_p": ("--min-p", _between(0.0, 1.0), "a probability in [0, 1]"),
    "repeat_penalty": ("--repeat-penalty", _between(1e-9, math.inf), "a finite number > 0 (1 = off)"),
    "repeat_last_n": ("--repeat-last-n", _between(-1, _INT32), "-1 (the context) or a token count >= 0"),
    "typical": ("--typical", _between(-math.inf, math.inf), "a finite number (>= 1: off)"),
    "top_nsigma": ("--top-nsigma", _between(-math.inf, math.inf), "a finite number (<= 0: off)"),
    "presence_penalty": ("--presence-penalty", _between(-math.inf, math.inf), "a finite number (0 = off)"),
    "frequency_penalty": ("--frequency-penalty", _between(-math.inf, math.inf), "a finite number (0 = off)"),
    "dry_multiplier": ("--dry-multiplier", _between(-math.inf, math.inf), "a finite number (0 = off)"),
    "dry_base": ("--dry-base", _between(-math.inf, math.inf), "a finite number (>= 1)"),
    "dry_allowed_length": ("--dry-allowed-length", _between(0, _INT32), "a token count >= 0"),
    "dry_penalty_last_n": ("--dry-penalty-last-n", _between(0, _INT32), "a token count >= 0 (0 = off)"),
    "xtc_probability": ("--xtc-probability", _between(0.0, 1.0), "a probability in [0, 1]"),
    "xtc_threshold": ("--xtc-threshold", _between(-math.inf, math.inf), "a finite number (> 0.5: off)"),
    "mirostat": ("--mirostat", _between(0, 2), "0 (off), 1 or 2"),
    "mirostat_lr": ("--mirostat-lr", _between(-math.inf, math.inf), "a finite number"),
    "mirostat_ent": ("--mirostat-ent", _between(-math.inf, math.inf), "a finite number"),
    "seed": ("-s/--seed", _between(-1, 2**32 - 1), "-1 (random) or 0 to 4294967295"),
    "repetitions": ("-r/--repetitions", _between(1, 100_000), "a count >= 1"),
    "chunks": ("--chunks", _between(-1, _INT32), "-1 (all) or a chunk count >= 1"),
    "port": ("-p/--port", _between(1, 65535), "a TCP port, 1 to 65535"),
    "parallel": ("-np/--parallel", _between(1, 64), "1 to 64 sequences"),
    "mem": ("-m/--mem", _between(0, 2**40), "MiB >= 0"),
}
#: list-valued flags (bench): every element by the rule
LIST_RULES: dict[str, Rule] = {
    "npp": ("-npp", _between(1, _INT32), "prompt lengths >= 1"),
    "ntg": ("-ntg", _between(1, _INT32), "token counts >= 1"),
    "npl": ("-npl", _between(1, 64), "sequence counts of 1 to 64"),
    "n_prompt": ("-p/--n-prompt", _between(0, _INT32), "token counts >= 0"),
    "n_gen": ("-n/--n-gen", _between(0, _INT32), "token counts >= 0"),
}
#: file flags: dest -> flag
FILES = {"model": "-m/--model", "file": "-f/--file"}


def check(args: argparse.Namespace, error: Callable[[str], Exception]) -> None:
    """Raise ``error(message)`` for the first flag whose value breaks its rule."""
    ns = vars(args)
    for dest, (flag, ok, good) in RULES.items():
        if dest in ns and ns[dest] is not None and not ok(ns[dest]):
            raise error(f"{flag} {ns[dest]!r} is out of range: expected {good}")
    for dest, (flag, ok, good) in LIST_RULES.items():
        if dest in ns and ns[dest] is not None:
            if not ns[dest]:
                raise error(f"{flag}: no values given: expected {good}")
            for v in ns[dest]:
                if not ok(v):
                    raise error(f"{flag} {v!r} is out of range: expected {good}")
    for dest, flag in FILES.items():
        path = ns.get(dest)
        dump = ns.get("command") == "dump"  # dump's FILE, like -m, may name a packaged model
        if isinstance(path, str) and not ((dest == "model" or dump) and _is_model_name(path)):
            _check_file(path, "FILE" if dump else flag, error)


def thread_warning(args: argparse.Namespace) -> str | None:
    """A warning when -t asks for more threads than this process has cores, else None.

    The threads meet at a barrier after every graph node, so a thread without a core of its own
    holds all the others up whenever it waits for one: -t above the core count is slower, not
    faster, which a new user does not expect."""
    threads = vars(args).get("threads")
    if not isinstance(threads, int) or threads <= 0:
        return None
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    if threads <= cores:
        return None
    return (f"warning: -t {threads} is more threads than the {cores} cores this process may run on: the extra "
            f"threads wait for a core and hold the others up, so it runs slower, not faster (-t 0: all {cores})")


def _is_model_name(path: str) -> bool:
    """-m also takes a packaged model's short name (llm/packaged.py)."""

    return is_registry_name(path)


def _check_file(path: str, flag: str, error: Callable[[str], Exception]) -> None:
    p = Path(path)
    if not p.exists():
        raise error(f"{flag}: file not found: {path}")
    if p.is_dir():
        raise error(f"{flag}: {path} is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise error(f"{flag}: {path} is not readable (permission denied)")
