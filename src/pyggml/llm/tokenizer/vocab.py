"""A model's vocabulary and tokenizer, as llama.cpp's ``llama_vocab``.

    vocab = Vocab.from_gguf("model.gguf")
    ids = vocab.tokenize("Hello world", add_special=True, parse_special=False)
    text = vocab.detokenize(ids, remove_special=True)

Five tokenizer models are implemented: SentencePiece (``tokenizer.ggml.model = "llama"``, e.g.
Llama 2, Gemma), BPE (``"gpt2"`` and ``"gemma4"``, e.g. Llama 3, Qwen2) with every pre-tokenizer of
:mod:`.pretokenize`, WordPiece (``"bert"``), Unigram (``"t5"``) and RWKV (``"rwkv"``).
Results are token for token those of llama.cpp's
``llama_tokenize`` / ``llama_token_to_piece`` / ``llama_detokenize``.

Text is a Python ``str``. Pieces are ``bytes``: one token can hold part of a UTF-8 character
(a byte-fallback token), so only whole sequences are decoded to ``str``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ...gguf import GGUFReader
from .attrs import BYTE, CONTROL, HIDDEN, NORMAL, UNUSED, USER_DEFINED
from .bpe import BPETokenizer
from .detok import clean_spaces, decode_byte_level
from .errors import InvalidTokenError, TokenizeError
from .load import TOKEN_NULL, VocabData, load_vocab_data
from .rwkv import RWKVTokenizer, unescape_rwkv_token
from .special import partition
from .spm import spm_tokenize
from .ugm import UGMTokenizer
from .unicode import BYTE_TO_CHAR
from .wpm import WPMTokenizer

if TYPE_CHECKING:
    from ...gguf import GGUFContext

_ESCAPED_SPACE = "\u2581"  # SentencePiece's visible space, "▁"


class _SpecialId:
    """A read-only attribute for one special token id (TOKEN_NULL, -1, when the vocab has none)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, vocab: Vocab | None, owner: type | None = None) -> int:
        if vocab is None:
            return self  # type: ignore[return-value]
        return vocab.ids[self.name]


class Vocab(VocabData):
    """Tokenizer state loaded from GGUF metadata; see :func:`.load.load_vocab_data`."""

    bos = _SpecialId()
    eos = _SpecialId()
    eot = _SpecialId()
    eom = _SpecialId()
    unk = _SpecialId()
    sep = _SpecialId()
    pad = _SpecialId()
    mask = _SpecialId()
    fim_pre = _SpecialId()
    fim_suf = _SpecialId()
    fim_mid = _SpecialId()
    fim_pad = _SpecialId()
    fim_rep = _SpecialId()
    fim_sep = _SpecialId()

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self._pieces: dict[int, bytes] = {}
        self._bpe = BPETokenizer(self.token_to_id, self.bpe_ranks, self.pre) if self.pre is not None else None
        self._session: WPMTokenizer | UGMTokenizer | RWKVTokenizer | None = None
        if self.vocab_type == "WPM":
            self._session = WPMTokenizer(self.tokens, self.ids["unk"], self.lowercase, self.strip_accents)
        elif self.vocab_type == "UGM":
            self._session = UGMTokenizer(
                self.tokens, self.scores, self.attrs, self.ids["unk"], self.precompiled_charsmap,
                escape_whitespaces=self.escape_whitespaces, add_space_prefix=self.add_space_prefix,
                remove_extra_whitespaces=self.remove_extra_whitespaces,
            )  # fmt: skip
        elif self.vocab_type == "RWKV":
            self._session = RWKVTokenizer(self.tokens, self.ids["unk"])

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Vocab:
        """From a mapping of GGUF key -> value (any reader's); only ``tokenizer.*`` and ``general.*`` are read."""
        return cls(**vars(load_vocab_data(metadata)))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Vocab:
        """From a GGUF file, read with :class:`pyggml.gguf.GGUFReader` (only the metadata is touched)."""
        with GGUFReader(path) as reader:
            return cls.from_reader(reader)

    @classmethod
    def from_reader(cls, reader: GGUFContext) -> Vocab:
        """From an open GGUF file or context (e.g. the one a model loader already holds)."""
        return cls.from_metadata(
            {kv.key: kv.value for kv in reader.kvs() if kv.key.startswith(("tokenizer.", "general."))}
        )

    # ---- simple queries ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def type_name(self) -> str:
        """llama.cpp's vocab type: SPM, BPE, WPM, UGM or RWKV."""
        return self.vocab_type

    @property
    def nl(self) -> int:
        """The newline token (llama.cpp's linefeed_id): "<0x0A>" for SPM, PAD for WPM, else the first token of "\\n"."""
        if self.vocab_type == "WPM":
            return self.ids["pad"]
        try:
            if self.is_spm:
                ids = [self.byte_to_token(0x0A)]
            elif self._session is not None:
                ids = self._tokenize_session(["\n"], False, [])
            else:
                ids = self._encode_raw("\n")
        except TokenizeError:
            ids = []
        return ids[0] if ids else self.ids["pad"]

    def _check(self, token: int) -> None:
        if not 0 <= token < len(self.tokens):
            raise InvalidTokenError(f"token id {token} is outside the vocabulary of {len(self.tokens)} tokens")

    def token_get_text(self, token: int) -> str:
        self._check(token)
        return self.tokens[token]

    def token_get_score(self, token: int) -> float:
        self._check(token)
        return self.scores[token]

    def token_get_attr(self, token: int) -> int:
        self._check(token)
        return self.attrs[token]

    def is_eog(self, token: int) -> bool:
        """Whether the token ends generation (EOS, EOT, <end_of_turn>, ...)."""
        return token in self.eog_ids

    def is_control(self, token: int) -> bool:
        return bool(self.token_get_attr(token) & CONTROL)

    def is_byte(self, token: int) -> bool:
        return bool(self.token_get_attr(token) & BYTE)

    def is_user_defined(self, token: int) -> bool:
        return bool(self.token_get_attr(token) & USER_DEFINED)

    def is_unused(self, token: int) -> bool:
        return bool(self.token_get_attr(token) & UNUSED)

    def text_to_token(self, text: str) -> int:
        """The id of the token with exactly this text, or TOKEN_NULL (-1)."""
        return self.token_to_id.get(text, TOKEN_NULL)

    def byte_to_token(self, byte: int) -> int:
        """The token that stands for one raw byte: SPM ``<0xXX>`` (else the 1-byte text), BPE its GPT-2 character."""
        if self.is_spm:
            tid = self.token_to_id.get(f"<0x{byte:02X}>")
            if tid is None:
                tid = self.token_to_id.get(bytes([byte]).decode("utf-8", "surrogateescape"))
        else:
            tid = self.token_to_id.get(BYTE_TO_CHAR[byte])
        if tid is None:
            raise TokenizeError(f"the vocabulary has no token for byte 0x{byte:02X} (byte fallback impossible)")
        return tid

    def token_to_byte(self, token: int) -> int:
        """The byte a BYTE token (``<0xXX>``) stands for."""
        if not self.is_byte(token):
            raise InvalidTokenError(f"token {token} ({self.tokens[token]!r}) is not a byte token")
        digits = self.tokens[token][3:5]
        n = 0
        for c in digits:  # like strtol: leading hex digits only
            if c not in "0123456789abcdefABCDEF":
                break
            n = n * 16 + int(c, 16)
        return n

    # ---- tokenize ------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (``llama_tokenize``).

        ``add_special`` adds BOS/EOS where the vocab asks for them; ``parse_special`` lets control
        tokens written in the text (``<start_of_turn>``) become those tokens. User-defined tokens
        are always recognised.
        """
        if not isinstance(text, str):
            raise TokenizeError(f"text to tokenize must be a str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizeError(f"text is not valid Unicode: {e.reason} at index {e.start}") from None
        fragments = partition(text, self.special_ids, self.tokens, self.attrs, parse_special)
        out: list[int] = []
        if self._session is not None:
            return self._tokenize_session(fragments, add_special, out)
        if add_special and self.add_bos:
            out.append(self.ids["bos"])
        if self.is_spm:
            prev_special = True  # the first fragment counts as following a special token
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                spm_tokenize(frag.replace(" ", _ESCAPED_SPACE), self.token_to_id, self.scores, self.byte_to_token, out)
                prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._encode_raw(frag.replace(" ", _ESCAPED_SPACE) if self.escape_whitespaces else frag, out)
        if add_special and self.add_eos:
            out.append(self.ids["eos"])
        return out

    def _tokenize_session(self, fragments: list[str | int], add_special: bool, out: list[int]) -> list[int]:
        """WPM (BOS ... SEP), UGM (BOS/EOS by the flags) and RWKV (nothing added) tokenization."""
        assert self._session is not None
        kind = self.vocab_type
        if add_special and (kind == "WPM" or (kind == "UGM" and self.add_bos)):
            out.append(self._required("bos"))
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._session.tokenize(frag, out)
        if add_special and kind == "WPM":
            out.append(self._required("sep"))
        elif add_special and kind == "UGM" and self.add_eos:
            out.append(self._required("eos"))
        return out

    def _required(self, name: str) -> int:
        tid = self.ids[name]
        if tid == TOKEN_NULL:
            raise TokenizeError(f"the {self.vocab_type} vocab must add a {name.upper()} token but has none")
        return tid

    def _encode_raw(self, text: str, out: list[int] | None = None) -> list[int]:
        """BPE tokens of raw text, with no special-token handling."""
        out = [] if out is None else out
        assert self._bpe is not None
        self._bpe.tokenize(text, out)
        return out

    # ---- detokenize ----------------------------------------------------------------------

    def token_to_piece(self, token: int, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes a token stands for (``llama_token_to_piece``).

        Control and unknown tokens give ``b""`` unless ``special``; up to ``lstrip`` leading
        spaces are removed.
        """
        self._check(token)
        if not special and self.attrs[token] & HIDDEN:
            return b""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token)
        if lstrip:
            n = 0
            while n < lstrip and n < len(piece) and piece[n] == 0x20:
                n += 1
            piece = piece[n:]
        return piece

    def _piece(self, token: int) -> bytes:
        attr = self.attrs[token]
        text = self.tokens[token]
        if self.vocab_type == "RWKV":
            return unescape_rwkv_token(text)
        if attr & (HIDDEN | USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & NORMAL:
            if self._bpe is None or self.escape_whitespaces:  # SPM, WPM, UGM, SentencePiece-style BPE
                return text.replace(_ESCAPED_SPACE, " ").encode("utf-8", "surrogateescape")
            return decode_byte_level(text)
        if attr & BYTE:
            return bytes([self.token_to_byte(token)])
        return b""  # UNUSED, UNDEFINED

    def detokenize_bytes(
        self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """The bytes of a token sequence (``llama_detokenize``).

        ``remove_special`` drops a leading BOS / trailing EOS that the vocab adds itself;
        ``unparse_special`` renders control tokens as their text.
        """
        ids = list(tokens)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.ids["bos"]:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.ids["eos"]:
            ids = ids[:-1]
        parts = []
        for tok in ids:
            parts.append(self.token_to_piece(tok, unparse_special, 1 if remove_space else 0))
            remove_space = False
        out = b"".join(parts)
        return clean_spaces(out) if self.clean_spaces else out

    def detokenize(self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        """:meth:`detokenize_bytes` decoded as UTF-8 (a broken sequence becomes U+FFFD)."""
        return self.detokenize_bytes(tokens, remove_special, unparse_special).decode("utf-8", "replace")

    def __repr__(self) -> str:
        pre = f", pre={self.pre_name!r}" if not self.is_spm else ""
        ids = self.ids
        return f"Vocab({self.type_name}, n_tokens={len(self.tokens)}{pre}, bos={ids['bos']}, eos={ids['eos']})"
