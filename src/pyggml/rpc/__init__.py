"""ggml's RPC backend (protocol 7.0.0): a server exposing pyggml devices over TCP and a client
backend whose buffers and graphs live on a remote server (pyggml's or llama.cpp's)."""

from __future__ import annotations

from .protocol import RPCError

__all__ = ["RPCError"]
