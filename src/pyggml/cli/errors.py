"""The CLI's own error: what a user did wrong on the command line."""

from __future__ import annotations


class CLIError(Exception):
    """A user-facing error: printed as ``error: <message>`` with exit status 1."""
