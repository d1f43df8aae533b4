"""The speculative-decoding flags of ``generate`` and ``serve``, named as llama.cpp's (common/arg.cpp).

llama.cpp at the reference commit spells the draft lengths ``--spec-draft-n-max``/``--spec-draft-n-min``
(it now refuses its older ``--draft-max``/``--draft-min``); pyggml takes both spellings.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import PyGGMLError
from ..llm.context import ContextParams, LlamaContext
from ..llm.model import Model
from ..llm.packaged import resolve
from ..llm.speculative import SPEC_TYPES, SpecParams, check_vocab_compatible, make_drafters
from ..llm.tokenizer import Vocab
from .errors import CLIError


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    d = SpecParams()
    g = p.add_argument_group("speculative decoding")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None, metavar="FNAME",
                   help="draft model for speculative decoding: a GGUF file or a packaged model's name, with the "
                        "target's vocabulary (default: unused)")
    g.add_argument("--spec-type", default=None, metavar="TYPES",
                   help=f"comma-separated speculative decoding types: none, {', '.join(SPEC_TYPES)} (default: "
                        "draft-simple with -md, else none). ngram-simple drafts from earlier text, no second model")
    g.add_argument("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n", dest="draft_max", type=int,
                   default=d.n_max, metavar="N",
                   help=f"tokens the draft model proposes per step (default {d.n_max})")
    g.add_argument("--spec-draft-n-min", "--draft-min", "--draft-n-min", dest="draft_min", type=int,
                   default=d.n_min, metavar="N",
                   help=f"a shorter draft of the draft model is not checked (default {d.n_min})")
    g.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=float, default=d.p_min,
                   metavar="P",
                   help=f"stop drafting when the draft's top token is less likely than P (default {d.p_min:.2f})")
    g.add_argument("-td", "--threads-draft", "--spec-draft-threads", dest="threads_draft", type=int, default=None,
                   metavar="N", help="CPU threads of the draft model (default: same as --threads)")
    g.add_argument("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl",
                   dest="gpu_layers_draft", type=int, default=0, metavar="N",
                   help="draft model layers to offload, as -ngl (default 0)")
    g.add_argument("--spec-ngram-simple-size-n", dest="ngram_size_n", type=int, default=d.ngram_size_n, metavar="N",
                   help=f"ngram-simple: tokens of the n-gram looked up in earlier text (default {d.ngram_size_n})")
    g.add_argument("--spec-ngram-simple-size-m", dest="ngram_size_m", type=int, default=d.ngram_size_m, metavar="M",
                   help=f"ngram-simple: the most tokens drafted after a match (default {d.ngram_size_m})")


def spec_params_from_args(args: argparse.Namespace) -> SpecParams | None:
    """The flags as SpecParams, None when speculative decoding is off; bad values are CLIErrors."""
    if args.spec_type is None:
        types: tuple[str, ...] = ("draft-simple",) if args.model_draft else ()
    else:
        names = [t.strip() for t in args.spec_type.split(",") if t.strip()]
        types = tuple(t for t in names if t != "none")
        if "none" in names and types:
            raise CLIError(f"--spec-type {args.spec_type}: 'none' cannot be combined with other types")
    params = SpecParams(types=types, n_max=args.draft_max, n_min=args.draft_min, p_min=args.draft_p_min,
                        ngram_size_n=args.ngram_size_n, ngram_size_m=args.ngram_size_m)
    try:
        params.check()
    except PyGGMLError as e:
        raise CLIError(str(e)) from e
    if "draft-simple" in types and not args.model_draft:
        raise CLIError("--spec-type draft-simple needs a draft model: give it with -md FILE")
    if args.model_draft and "draft-simple" not in types:
        raise CLIError(f"a draft model was given (-md) but --spec-type {args.spec_type} leaves it unused: add "
                       "draft-simple")
    if args.threads_draft is not None and args.threads_draft < 0:
        raise CLIError(f"-td/--threads-draft must be >= 0, got {args.threads_draft}")
    return params if types else None


def load_draft_context(args: argparse.Namespace, vocab: Any, n_seq_max: int = 1,
                       n_ctx: int | None = None) -> LlamaContext:
    """Load -md, check its vocabulary against the target's and give it a context like the target's."""
    path = resolve(args.model_draft)
    if not path.is_file():
        raise CLIError(f"draft model file not found: {path}")
    if not args.quiet:
        print(f"loading draft model {path}", file=sys.stderr)
    model = Model(path, progress=not args.quiet, n_gpu_layers=args.gpu_layers_draft)
    try:
        check_vocab_compatible(vocab, Vocab.from_metadata(model.reader))
    except PyGGMLError as e:
        raise CLIError(f"-md {args.model_draft}: {e}") from e
    if not model.arch.has_logits:
        raise CLIError(f"-md {args.model_draft}: {model.hparams.arch} models compute embeddings, not logits: "
                       "they cannot draft")
    threads = args.threads if args.threads_draft is None else args.threads_draft
    params = ContextParams(n_ctx=args.ctx_size if n_ctx is None else n_ctx, n_batch=args.batch_size,
                           n_ubatch=args.ubatch_size, n_threads=threads, flash_attn=args.flash_attn == "on",
                           n_seq_max=n_seq_max, kv_unified=getattr(args, "kv_unified", True))
    return LlamaContext(model, params)


def drafters_from_args(args: argparse.Namespace, vocab: Any, n_seq_max: int = 1,
                       n_ctx: int | None = None) -> tuple[list[Any] | None, int]:
    """The drafters the flags ask for (a draft model loaded and checked; None when speculation is off)
    and the length drafts are padded to where they fall a little short (speculative.pad_draft): the
    longest draft any of them makes (--spec-draft-n-max, --spec-ngram-simple-size-m)."""
    params = spec_params_from_args(args)
    if params is None:
        return None, 0
    draft_ctx = load_draft_context(args, vocab, n_seq_max, n_ctx) if "draft-simple" in params.types else None
    lengths = [params.n_max] if draft_ctx is not None else []
    lengths += [params.ngram_size_m] if "ngram-simple" in params.types else []
    return make_drafters(params, draft_ctx), max(lengths)
