"""The ``tokenizer.ggml.*`` keys of a byte-level BPE tokenizer, as llama.cpp's converter writes them.

llama.cpp's ``_set_vocab_gpt2`` (``get_vocab_base`` + ``gguf.SpecialVocab``) lists the tokens in id
order up to the model's ``vocab_size`` (holes become ``[PAD<i>]`` UNUSED tokens, so the token list
and the embedding rows always agree), marks special added tokens CONTROL and other added tokens
USER_DEFINED, and copies the merges as ``"left right"`` strings. The runner builds its vocabulary
from these keys alone, so getting them right is what makes pyggml tokenize as the HF tokenizer does.

Accepted tokenizers: a ``tokenizers.Tokenizer`` or a transformers fast tokenizer (anything with a
``backend_tokenizer``). Only BPE models are handled; SentencePiece vocabularies are not converted.
Added tokens the tokenizer does not normalize are stored as ``decode(encode(token))``, as llama.cpp
does, because its tokenizer expects CONTROL and USER_DEFINED texts pre-normalized.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import PyGGMLError
from ...gguf.constants import Keys

# gguf token types (llama.h's llama_token_type / gguf-py's TokenType)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5

#: the pre-tokenizer name llama.cpp's converter picks for each architecture's stock tokenizer
DEFAULT_PRE = {"llama": "llama-bpe", "qwen2": "qwen2", "gemma3": "default"}

_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
#: special token kind -> its GGUF key ("seperator" included, as gguf spells it)
_ID_KEYS = {"bos": Keys.TOKENIZER_BOS_ID, "eos": Keys.TOKENIZER_EOS_ID, "unk": Keys.TOKENIZER_UNK_ID,
            "sep": Keys.TOKENIZER_SEP_ID, "pad": Keys.TOKENIZER_PAD_ID, "cls": Keys.TOKENIZER_CLS_ID,
            "mask": Keys.TOKENIZER_MASK_ID}


class ConversionError(PyGGMLError, ValueError):
    """A Hugging Face model, config or tokenizer that cannot be converted to GGUF as given."""


def _backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` (itself when it already is one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if hasattr(tokenizer, "to_str") and hasattr(tokenizer, "get_vocab"):
        return tokenizer
    raise ConversionError(
        f"unsupported tokenizer object {type(tokenizer).__name__}: pass a tokenizers.Tokenizer or a fast "
        "transformers tokenizer"
    )


_SPECIAL_LOOKING = frozenset({"<pad>", "<mask>", "<2mass>", "[@BOS@]"})
_SPECIAL_BRACKETS = (("<|", "|>"), ("<\uff5c", "\uff5c>"), ("<unused", ">"))


def _looks_special(token: str) -> bool:
    """llama.cpp's does_token_look_special: control tokens some models forget to flag as special."""
    return token in _SPECIAL_LOOKING or any(token.startswith(a) and token.endswith(b) for a, b in _SPECIAL_BRACKETS)


def _special_ids(tokenizer: Any, vocab: dict[str, int], overrides: dict[str, int] | None) -> dict[str, int]:
    """bos/eos/... ids: a transformers tokenizer knows them; a bare ``tokenizers.Tokenizer`` needs ``overrides``."""
    ids: dict[str, int] = {}
    for kind in _SPECIAL_KINDS:
        tid = getattr(tokenizer, f"{kind}_token_id", None)
        if isinstance(tid, int) and tid >= 0:
            ids[kind] = tid
    for kind, tid in (overrides or {}).items():
        if kind not in _SPECIAL_KINDS:
            raise ConversionError(f"unknown special token kind {kind!r} (known: {', '.join(_SPECIAL_KINDS)})")
        ids[kind] = int(tid)
    n = max(vocab.values()) + 1
    for kind, tid in ids.items():
        if not 0 <= tid < n:
            raise ConversionError(f"{kind} token id {tid} is outside the tokenizer's {n} ids")
    return ids


def _adds_around(backend: Any, ids: dict[str, int]) -> tuple[bool, bool]:
    """Whether encoding adds BOS in front / EOS at the end.

    llama.cpp reads this from tokenizer_config.json or the post-processor template; asking the
    tokenizer itself gives the same answer without parsing either.
    """
    probe = "a"
    with_special = backend.encode(probe, add_special_tokens=True).ids
    plain = backend.encode(probe, add_special_tokens=False).ids
    add_bos = "bos" in ids and len(with_special) > len(plain) and with_special[0] == ids["bos"]
    add_eos = "eos" in ids and len(with_special) > len(plain) and with_special[-1] == ids["eos"]
    return add_bos, add_eos


def tokenizer_metadata(
    tokenizer: Any,
    arch: str,
    n_vocab: int,
    pre: str | None = None,
    special_ids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys for ``tokenizer`` in a model with ``n_vocab`` embedding rows."""
    backend = _backend(tokenizer)
    spec = json.loads(backend.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise ConversionError(f"only BPE tokenizers can be converted, this one is {model.get('type')!r}")
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    n_tok = max(vocab.values()) + 1
    if n_tok > n_vocab:
        raise ConversionError(f"the tokenizer has {n_tok} ids but the model's vocab_size is only {n_vocab}")
    by_id = {i: t for t, i in vocab.items()}
    added = backend.get_added_tokens_decoder()
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        elif i in added:
            if not added[i].normalized:
                tok = backend.decode(backend.encode(tok, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].special or _looks_special(tok):
                types.append(TOKEN_CONTROL)
            else:
                tok = tok.replace("\u2581", " ")  # llama.cpp expects user-defined tokens pre-normalized
                types.append(TOKEN_USER_DEFINED)
            tokens.append(tok)
        else:
            tokens.append(tok)
            types.append(TOKEN_NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    md: dict[str, Any] = {
        Keys.TOKENIZER_MODEL: "gpt2",
        Keys.TOKENIZER_PRE: pre or DEFAULT_PRE.get(arch, "default"),
        Keys.TOKENIZER_LIST: tokens,
        Keys.TOKENIZER_TOKEN_TYPE: types,
        Keys.TOKENIZER_MERGES: merges,
    }
    ids = _special_ids(tokenizer, vocab, special_ids)
    for kind, tid in ids.items():
        md[_ID_KEYS[kind]] = tid
    # written even when False: the runner's default for a missing key depends on the vocabulary type
    md[Keys.TOKENIZER_ADD_BOS], md[Keys.TOKENIZER_ADD_EOS] = _adds_around(backend, ids)
    return md
