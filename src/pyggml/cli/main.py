"""``pyggml`` entry point: one sub-command per module in this package.

Each command module defines ``add_parser(subparsers)`` which adds its parser and sets
``func`` (called with the parsed args, returning an exit status). Errors that users cause
(bad files, bad flags) are raised as :class:`CLIError` or a library error and printed as one
``error:`` line on stderr, with exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from ..errors import PyGGMLError
from .checks import check, thread_warning
from .errors import CLIError

#: sub-command modules, in the order ``--help`` lists them
COMMANDS = ["generate", "chat", "serve", "batched", "bench", "perplexity", "embedding", "tokenize", "dump", "devices",
            "rpc_server", "quantize", "imatrix"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse with errors on one line: ``error: <what> (see pyggml CMD --help)``, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return version("pyggml")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "(not installed)"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command ``only`` alone: each command module imports what it
    runs (numba, the quantizers, the server stack), so a run loads only its own (a warm ``pyggml
    generate`` starts about 0.3 s sooner)."""
    parser = ArgumentParser(
        prog="pyggml",
        description="pyggml: ggml, the tensor engine under llama.cpp, in Python.",
    )
    parser.add_argument("--version", action="version", version=f"pyggml {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else [only]:
        importlib.import_module(f"pyggml.cli.{name}").add_parser(sub)
    return parser


def _command_module(argv: list[str]) -> str | None:
    """The module of the command argv names first (``rpc-server`` -> rpc_server), or None."""
    name = argv[0].replace("-", "_") if argv else ""
    return name if name in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_module(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        check(args, CLIError)
        warning = thread_warning(args)
        if warning and not getattr(args, "quiet", False):
            print(warning, file=sys.stderr)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # user-facing: one line, no traceback
        if isinstance(e, CLIError | PyGGMLError | OSError):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
