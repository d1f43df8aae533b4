r"""llama.cpp's RWKV tokenizer (``llm_tokenizer_rwkv_session``): greedy longest match on bytes.

RWKV vocabularies hold arbitrary byte strings; GGUF stores them escaped (``\x00``, ``\n``,
``\t``, ``\r``, ``\\``), and llama.cpp unescapes them into a trie. Text is covered left to right
by the longest token that starts at each byte; a byte no token starts with becomes UNK.
"""

from __future__ import annotations

from .errors import TokenizeError

_ESCAPES = {ord("t"): 0x09, ord("n"): 0x0A, ord("r"): 0x0D}


def unescape_rwkv_token(escaped: str) -> bytes:
    r"""``llama_unescape_rwkv_token``: ``\xHH`` (lower-case hex), ``\t \n \r``, and ``\c`` for any other c."""
    out = bytearray()
    escaping = False
    hex_left = 0
    acc = 0
    for c in escaped.encode("utf-8", "surrogateescape"):
        if hex_left:
            acc = ((acc << 4) + (c - ord("a") + 10 if c >= ord("a") else c - ord("0"))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == ord("x"):
                hex_left = 2
            else:
                out.append(_ESCAPES.get(c, c))
            escaping = False
        elif c == ord("\\"):
            escaping = True
        else:
            out.append(c)
    return bytes(out)


class RWKVTokenizer:
    """Tokenizes raw-text fragments for one RWKV vocabulary."""

    def __init__(self, tokens: list[str], unk: int) -> None:
        self.by_bytes: dict[bytes, int] = {}
        prefixes: set[bytes] = set()
        for i, t in enumerate(tokens):
            b = unescape_rwkv_token(t)
            self.by_bytes[b] = i  # llama.cpp's trie keeps the last id for a repeated string
            prefixes.update(b[:k] for k in range(1, len(b)))
        self.prefixes = prefixes | set(self.by_bytes)
        self.max_len = max(map(len, self.by_bytes), default=0)
        self.unk = unk

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the tokens of one raw-text fragment to ``out``."""
        data = text.encode("utf-8", "surrogateescape")
        n = len(data)
        pos = 0
        while pos < n:
            best, best_end = -1, 0
            end = pos + 1
            while end <= n and end - pos <= self.max_len and data[pos:end] in self.prefixes:
                tid = self.by_bytes.get(data[pos:end])
                if tid is not None:
                    best, best_end = tid, end
                end += 1
            if end == pos + 1:  # no token starts with this byte
                if self.unk < 0:
                    raise TokenizeError(f"byte 0x{data[pos]:02X} starts no RWKV token and the vocab has no UNK")
                out.append(self.unk)
                pos += 1
                continue
            if best < 0:
                raise TokenizeError(f"bytes at offset {pos} only start longer RWKV tokens (llama.cpp loops forever)")
            out.append(best)
            pos = best_end
