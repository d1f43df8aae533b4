"""Reading a vocabulary from GGUF metadata the way ``llama_vocab::impl::load`` does.

Input is a plain mapping of GGUF key -> value (str, int, float, bool, or a sequence for
arrays), so any GGUF reader can feed it. The steps and their order follow llama.cpp, since
later steps depend on earlier ones: type defaults, pre-tokenizer flags, the token table,
special ids, add_bos/add_eos, EOT/EOM/FIM detection by text, the UNUSED and EOG marks, the
special-token cache, and finally the per-model LSTRIP/RSTRIP attributes.

Where llama.cpp iterates an ``unordered_map`` (so the winner among several matching texts is
unspecified) pyggml takes the first text in its candidate list, e.g. ``<|eot_id|>`` before
``<|end_of_text|>`` and ``<|im_end|>`` before ``<|endoftext|>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...gguf import StringArray
from ...gguf.constants import Keys
from .attrs import CONTROL, LSTRIP, NORMAL, RSTRIP, SPECIAL, UNUSED, USER_DEFINED, attr_from_type
from .errors import UnsupportedTokenizerError, VocabError
from .pretokenize import PreTokenizer, pre_tokenizer

TOKEN_NULL = -1  #: LLAMA_TOKEN_NULL: "no such token"

#: special-id keys, in llama.cpp's order (the deprecated FIM names come last and win)
SPECIAL_ID_KEYS = (
    ("bos", Keys.TOKENIZER_BOS_ID), ("eos", Keys.TOKENIZER_EOS_ID), ("eot", Keys.TOKENIZER_EOT_ID),
    ("eom", Keys.TOKENIZER_EOM_ID), ("unk", Keys.TOKENIZER_UNK_ID), ("sep", Keys.TOKENIZER_SEP_ID),
    ("pad", Keys.TOKENIZER_PAD_ID), ("mask", Keys.TOKENIZER_MASK_ID), ("fim_pre", Keys.TOKENIZER_FIM_PRE_ID),
    ("fim_suf", Keys.TOKENIZER_FIM_SUF_ID), ("fim_mid", Keys.TOKENIZER_FIM_MID_ID),
    ("fim_pad", Keys.TOKENIZER_FIM_PAD_ID), ("fim_rep", Keys.TOKENIZER_FIM_REP_ID),
    ("fim_sep", Keys.TOKENIZER_FIM_SEP_ID), ("fim_pre", Keys.TOKENIZER_PREFIX_ID),
    ("fim_suf", Keys.TOKENIZER_SUFFIX_ID), ("fim_mid", Keys.TOKENIZER_MIDDLE_ID),
)  # fmt: skip

#: texts that identify a special token when its id is not in the metadata
DETECT_BY_TEXT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip

#: texts of tokens that end generation (they also become CONTROL)
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))  # fmt: skip

#: gpt-oss tokens that llama.cpp always renders (forced to USER_DEFINED)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


@dataclass
class VocabData:
    """Everything llama.cpp keeps in ``llama_vocab::impl`` that tokenization needs."""

    model: str  #: tokenizer.ggml.model as stored: "llama", "gpt2", "bert", "t5", "rwkv", "gemma4"
    vocab_type: str  #: llama.cpp's vocab type: "SPM", "BPE", "WPM", "UGM" or "RWKV"
    pre_name: str  #: tokenizer.ggml.pre as stored ("" if absent)
    pre: PreTokenizer | None  #: BPE only
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    token_to_id: dict[str, int]
    bpe_ranks: dict[tuple[str, str], int] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  #: bos, eos, eot, ... -> id or TOKEN_NULL
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    remove_extra_whitespaces: bool = False
    #: spaces become U+2581 before tokenizing (SPM, UGM; SentencePiece-style BPE such as Gemma 4)
    escape_whitespaces: bool = False
    #: BertNormalizer options (WPM): lower-case the text, drop accents
    lowercase: bool = True
    strip_accents: bool = True
    #: UGM's SentencePiece normalization table (tokenizer.ggml.precompiled_charsmap), raw bytes
    precompiled_charsmap: bytes = b""
    clean_spaces: bool = False
    ignore_merges: bool = False
    eog_ids: frozenset[int] = frozenset()
    special_ids: list[int] = field(default_factory=list)  #: cache_special_tokens, longest text first
    max_token_len: int = 0

    @property
    def is_spm(self) -> bool:
        return self.vocab_type == "SPM"


# ---- typed access to a plain mapping ---------------------------------------------------------


def _str(md: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    v = md.get(key, default)
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    raise VocabError(f"{key} must be a string, not {type(v).__name__}")


def _bool(md: Mapping[str, Any], key: str) -> bool | None:
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, bool | int) or getattr(getattr(v, "dtype", None), "kind", "") in ("b", "i", "u"):
        return bool(v)
    raise VocabError(f"{key} must be a bool, not {type(v).__name__}")


def _int(md: Mapping[str, Any], key: str) -> int | None:
    v = md.get(key)
    if v is None:
        return None
    try:
        if isinstance(v, bool | float | str | bytes):
            raise TypeError
        return int(v)  # numpy integers too
    except (TypeError, ValueError):
        raise VocabError(f"{key} must be an integer token id, not {type(v).__name__}") from None


def _array(md: Mapping[str, Any], key: str, n_min: int | None = None) -> Sequence[Any] | None:
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, str | bytes) or not hasattr(v, "__len__") or not hasattr(v, "__getitem__"):
        raise VocabError(f"{key} must be an array, not {type(v).__name__}")
    if n_min is not None and len(v) < n_min:
        raise VocabError(f"{key} has {len(v)} entries, fewer than the {n_min} tokens")
    return v


# ---- the load --------------------------------------------------------------------------------

#: tokenizer.ggml.model values pyggml reads -> llama.cpp's vocab type
VOCAB_TYPES = {"llama": "SPM", "gpt2": "BPE", "gemma4": "BPE", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV"}
#: models llama.cpp knows that pyggml does not tokenize (yet)
_NOT_IMPLEMENTED = ("no_vocab", "none", "plamo2", "hybriddna", "whitespace", "test")



def _model_defaults(model: str, pre_name: str) -> tuple[str, dict[str, int], dict[str, bool], PreTokenizer | None]:
    """vocab type, default special ids, flags and pre-tokenizer for a tokenizer model, as llama.cpp sets them."""
    vocab_type = VOCAB_TYPES.get(model)
    if vocab_type is None:
        known = ", ".join(f"{m!r} ({t})" for m, t in VOCAB_TYPES.items())
        what = "is not implemented in pyggml" if model in _NOT_IMPLEMENTED else "is unknown (llama.cpp refuses it too)"
        raise UnsupportedTokenizerError(f"tokenizer model {Keys.TOKENIZER_MODEL}={model!r} {what}; pyggml has {known}")
    pre = None
    if vocab_type == "SPM":
        return vocab_type, {"bos": 1, "eos": 2, "unk": 0}, {
            "add_space_prefix": True, "clean_spaces": False, "add_bos": True, "add_eos": False,
            "escape_whitespaces": True}, pre  # fmt: skip
    if vocab_type == "WPM":
        return vocab_type, {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}, {
            "add_space_prefix": False, "clean_spaces": True, "add_bos": True, "add_eos": False, "add_sep": True,
            "escape_whitespaces": True}, pre  # fmt: skip
    if vocab_type == "UGM":
        return vocab_type, {"eos": 1, "unk": 2, "pad": 0}, {
            "add_bos": False, "add_eos": True, "escape_whitespaces": True}, pre  # fmt: skip
    if vocab_type == "RWKV":
        return vocab_type, {}, {"add_space_prefix": False, "clean_spaces": False, "add_bos": False,
                                "add_eos": False, "escape_whitespaces": True}, pre  # fmt: skip
    # BPE; the "gemma4" model is BPE with the gemma4 pre-tokenizer whatever tokenizer.ggml.pre says
    pre = pre_tokenizer("gemma4" if model == "gemma4" else pre_name)
    defaults = {} if model == "gemma4" else {"eos": 11} if pre.no_bos else {"bos": 11, "eos": 11}
    flags = {
        "add_space_prefix": False,
        "clean_spaces": pre.clean_spaces,
        "ignore_merges": pre.ignore_merges,
        "add_bos": bool(pre.add_bos),
        "add_eos": False,
        "add_sep": pre.add_sep,
        "escape_whitespaces": pre.escape_whitespaces,
        "lowercase": pre.kind != "whitespace",
    }
    return vocab_type, defaults, flags, pre


def load_vocab_data(md: Mapping[str, Any]) -> VocabData:
    """A :class:`VocabData` from GGUF metadata; raises :class:`VocabError` naming the bad key."""
    model = _str(md, Keys.TOKENIZER_MODEL)
    if model is None:
        raise VocabError(f"{Keys.TOKENIZER_MODEL} is missing: the file has no tokenizer")
    pre_name = _str(md, Keys.TOKENIZER_PRE, "") or ""
    vocab_type, defaults, flags, pre = _model_defaults(model, pre_name)
    for flag, key in (("add_space_prefix", Keys.TOKENIZER_ADD_PREFIX),
                      ("remove_extra_whitespaces", Keys.TOKENIZER_REMOVE_EXTRA_WS)):  # fmt: skip
        if (v := _bool(md, key)) is not None:
            flags[flag] = v
    if pre is not None:
        pre_name = pre_name or ("gemma4" if model == "gemma4" else "")

    data = VocabData(model=model, vocab_type=vocab_type, pre_name=pre_name, pre=pre, **_token_table(md), **flags)  # type: ignore[arg-type]
    # Kimi-K2 files may lack merges: llama.cpp then splits by the pre-tokenizer and emits bytes
    if vocab_type == "BPE" and not (pre_name == "kimi-k2" and Keys.TOKENIZER_MERGES not in md):
        data.bpe_ranks = _merges(md)
    if vocab_type == "UGM":
        data.precompiled_charsmap = _charsmap(md)
    _special_ids(md, data, defaults)
    _add_flags(md, data)
    _normalizer_opts(md, data)
    _detect_by_text(data)
    _mark_unused(data)
    _eog(data)
    data.special_ids = sorted(
        _with_attr(data, SPECIAL),
        key=lambda i: -len(data.tokens[i].encode("utf-8", "surrogateescape")),
    )
    _model_specific_attrs(md, data)
    return data


def _token_table(md: Mapping[str, Any]) -> dict[str, Any]:
    raw = _array(md, Keys.TOKENIZER_LIST)
    if raw is None:
        raise VocabError(f"cannot find the tokenizer vocab: {Keys.TOKENIZER_LIST} is missing")
    tokens = raw.tolist() if hasattr(raw, "tolist") else list(raw)
    n = len(tokens)
    for i, tok in enumerate([] if isinstance(raw, StringArray) else tokens):  # a GGUF string array holds str
        if type(tok) is not str:
            if not isinstance(tok, str | bytes):
                raise VocabError(f"{Keys.TOKENIZER_LIST}[{i}] is a {type(tok).__name__}, not a string")
            tokens[i] = tok.decode("utf-8", "surrogateescape") if isinstance(tok, bytes) else str(tok)
    token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(token_to_id) != n or "" in token_to_id:  # rare: redo slowly to rename empties and name duplicates
        token_to_id = _checked_index(tokens)
    return {
        "tokens": tokens,
        "scores": _numbers(md, Keys.TOKENIZER_SCORES, n, float, "numbers"),
        "attrs": _numbers(md, Keys.TOKENIZER_TOKEN_TYPE, n, int, "integers"),
        "token_to_id": token_to_id,
        "max_token_len": max(map(len, tokens), default=0),
    }


#: token_type -> attribute bits, indexed by type; unknown types are UNDEFINED (0)
_TYPE_TABLE = np.array([attr_from_type(t) for t in range(7)], dtype=np.int64)


def _numbers(md: Mapping[str, Any], key: str, n: int, kind: type, what: str) -> list[Any]:
    """scores (as float) or token types (as attribute bits); defaults when the key is absent."""
    raw = _array(md, key, n)
    if raw is None:
        return [0.0] * n if kind is float else [NORMAL] * n
    try:
        arr = np.asarray(raw[:n] if len(raw) > n else raw)
    except (TypeError, ValueError):
        arr = np.asarray([], dtype=object)
    if arr.dtype.kind not in ("f", "i", "u") if kind is float else arr.dtype.kind not in ("i", "u"):
        raise VocabError(f"{key} must hold {what}, not {arr.dtype}")
    if kind is float:
        return arr.astype(np.float64).tolist()
    types = arr.astype(np.int64)
    return np.where((types >= 0) & (types < len(_TYPE_TABLE)), _TYPE_TABLE[np.clip(types, 0, 6)], 0).tolist()


def _checked_index(tokens: list[str]) -> dict[str, int]:
    token_to_id: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not tok:
            tok = tokens[i] = f"[EMPTY_{i}]"
        if token_to_id.setdefault(tok, i) != i:
            raise VocabError(f"duplicate token in vocabulary: {tok!r} has ids {token_to_id[tok]} and {i}")
    return token_to_id


def _merges(md: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    merges = _array(md, Keys.TOKENIZER_MERGES)
    if merges is None:
        raise VocabError(f"cannot find the tokenizer merges: {Keys.TOKENIZER_MERGES} is missing")
    ranks: dict[tuple[str, str], int] = {}
    for rank, m in enumerate(merges.tolist() if hasattr(merges, "tolist") else merges):
        if not isinstance(m, str):
            raise VocabError(f"{Keys.TOKENIZER_MERGES}[{rank}] is a {type(m).__name__}, not a string")
        cut = m.find(" ", 1)  # the first space that is not the first character
        pair = (m[:cut], m[cut + 1 :]) if cut >= 0 else ("", "")
        ranks.setdefault(pair, rank)  # a repeated pair keeps its first rank
    return ranks


def _special_ids(md: Mapping[str, Any], data: VocabData, defaults: dict[str, int]) -> None:
    n = len(data.tokens)
    ids = {name: TOKEN_NULL for name, _ in SPECIAL_ID_KEYS}
    ids.update(defaults)
    for name, key in SPECIAL_ID_KEYS:
        if ids[name] >= n:
            ids[name] = TOKEN_NULL  # a default outside a small vocab is disabled
        new_id = _int(md, key)
        if new_id is not None and 0 <= new_id < n:
            ids[name] = new_id  # llama.cpp ignores (with a warning) an id outside the vocab
    data.ids = ids


def _add_flags(md: Mapping[str, Any], data: VocabData) -> None:
    for flag, key, id_name in (("add_bos", Keys.TOKENIZER_ADD_BOS, "bos"), ("add_eos", Keys.TOKENIZER_ADD_EOS, "eos"),
                               ("add_sep", Keys.TOKENIZER_ADD_SEP, "sep")):  # fmt: skip
        if (v := _bool(md, key)) is not None:
            setattr(data, flag, v)
        if data.pre is not None and data.pre.kind == "gemma4" and flag == "add_bos":
            data.add_bos = True  # llama.cpp's workaround: Gemma 4 always starts with BOS
        if flag == "add_sep" and data.vocab_type != "WPM":
            continue  # only WPM tokenization appends SEP; llama.cpp leaves it to the embedding code elsewhere
        if getattr(data, flag) and data.ids[id_name] == TOKEN_NULL:
            raise VocabError(f"{key} is true, but the {id_name} token id is not set")


def _normalizer_opts(md: Mapping[str, Any], data: VocabData) -> None:
    """BertNormalizer options: strip_accents follows lowercase unless stored itself."""
    if (v := _bool(md, Keys.TOKENIZER_NORMALIZER_LOWERCASE)) is not None:
        data.lowercase = v
    data.strip_accents = data.lowercase
    if (v := _bool(md, Keys.TOKENIZER_NORMALIZER_STRIP_ACCENTS)) is not None:
        data.strip_accents = v


def _charsmap(md: Mapping[str, Any]) -> bytes:
    key = Keys.TOKENIZER_PRECOMPILED_CHARSMAP
    raw = md.get(key)
    if raw is None:
        return b""
    if isinstance(raw, bytes | bytearray):
        blob = bytes(raw)
    else:
        arr = np.asarray(raw)
        if arr.dtype not in (np.int8, np.uint8):  # llama.cpp accepts only GGUF INT8/UINT8 arrays here
            raise VocabError(f"{key} must be an int8 or uint8 array, not {arr.dtype}")
        blob = arr.astype(np.uint8).tobytes()
    if len(blob) < 4:
        raise VocabError(f"{key} is too small ({len(blob)} bytes) for its 4-byte header")
    trie_size = int.from_bytes(blob[:4], "little")
    if trie_size + 4 >= len(blob):
        raise VocabError(f"{key}: its trie of {trie_size} bytes overruns the {len(blob)}-byte blob")
    return blob


def _first_id(data: VocabData, texts: Sequence[str]) -> int:
    """The token of the first text in ``texts`` that the vocab has (llama.cpp: unspecified among several)."""
    for text in texts:
        if (tid := data.token_to_id.get(text)) is not None:
            return tid
    return TOKEN_NULL


def _detect_by_text(data: VocabData) -> None:
    for name, texts in DETECT_BY_TEXT.items():
        if data.ids[name] == TOKEN_NULL and (tid := _first_id(data, texts)) != TOKEN_NULL:
            data.ids[name] = tid
            data.attrs[tid] |= CONTROL


def _mark_unused(data: VocabData) -> None:
    for i in _with_attr(data, CONTROL):
        if "unused" in data.tokens[i]:
            data.attrs[i] |= UNUSED


def _with_attr(data: VocabData, bits: int) -> list[int]:
    """The ids whose attributes have any of ``bits``: found in numpy, since a vocabulary may hold 262k tokens
    and few of them are control or user-defined ones (a Python loop over all took 0.1 s of every start)."""
    attrs = np.fromiter(data.attrs, dtype=np.int64, count=len(data.attrs))
    return np.flatnonzero(attrs & bits).tolist()


def _eog(data: VocabData) -> None:
    ids, attrs, t2i = data.ids, data.attrs, data.token_to_id
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] != TOKEN_NULL}
    for text in EOG_TEXTS:
        if (tid := t2i.get(text)) is not None:
            eog.add(tid)
            attrs[tid] |= CONTROL
    for text in _ALWAYS_RENDERED:
        if (tid := t2i.get(text)) is not None:
            attrs[tid] = USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids[k] != TOKEN_NULL)

    texts = {data.tokens[i]: i for i in eog}
    # gpt-oss / solar-open: <|end|> only ends a message there, not the generation
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = USER_DEFINED
    # gemma4 / paddleocr: </s> is an ordinary token there
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = NORMAL
    data.eog_ids = frozenset(eog)


def _model_specific_attrs(md: Mapping[str, Any], data: VocabData) -> None:
    """LSTRIP/RSTRIP that llama.cpp sets by model name, since GGUF does not store them."""
    name = (_str(md, Keys.GENERAL_NAME, "") or "").lower()
    arch = _str(md, Keys.GENERAL_ARCHITECTURE, "") or ""
    pre = data.pre_name

    def set_attr(text: str, bit: int, on: bool) -> None:
        tid = data.token_to_id.get(text)
        if tid is None:
            raise VocabError(f"the vocabulary of a {name or pre or arch!r} model lacks the token {text!r}")
        data.attrs[tid] = data.attrs[tid] | bit if on else data.attrs[tid] & ~bit

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in data.token_to_id:
            set_attr("<mask>", LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in data.special_ids:
            data.attrs[tid] |= RSTRIP
        set_attr("</s>", RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, RSTRIP, False)
    elif "modern-bert" in name and "[MASK]" in data.token_to_id:
        set_attr("[MASK]", LSTRIP, True)
