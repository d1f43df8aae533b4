"""BPE pre-tokenizers: how ``tokenizer.ggml.pre`` splits text into words before merging.

llama.cpp names each pre-tokenizer in ``llama_vocab::impl::load`` and gives it a list of
regexes (``llm_tokenizer_bpe``). Each regex refines the previous split: every piece is cut
into its matches and the unmatched gaps between them, and all of them are kept. The regexes
here are llama.cpp's, written for :mod:`re` with explicit classes (see :mod:`.unicode`):
``{L}`` letters, ``{N}`` numbers, ``{P}`` punctuation, ``{S}`` White_Space.

llama.cpp runs the llama3 and gpt2 regexes through hand-written splitters and the others
through ``std::regex`` on a category-collapsed copy of the text; both compute the leftmost-first
backtracking matches of the regex, which is what :mod:`re` computes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...gguf.constants import Keys
from .errors import UnsupportedTokenizerError
from .unicode import expand_classes

# contractions are matched case-insensitively, but only for ASCII letters (llama.cpp's adapted form)
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])"


def _llama3_like(numbers: str) -> str:
    tail = r"| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"
    return _CONTRACTIONS + r"|[^\r\n{L}{N}]?[{L}]+|" + numbers + tail


LLAMA3 = _llama3_like("[{N}]{1,3}")
QWEN2 = _llama3_like("[{N}]")  # digits one by one
DEFAULT = (r"[{P}\$\+<=>\^~\|]+", GPT2, r"[{N}]+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type and the vocab flags that come with its name."""

    kind: str  #: llama.cpp's LLAMA_VOCAB_PRE_TYPE_* name, lower case
    patterns: tuple[str, ...]
    #: a word that is itself a token is emitted whole, without running the merges (llama3)
    ignore_merges: bool = False
    #: detokenize removes spaces before punctuation and some contractions
    clean_spaces: bool = True
    #: the default add_bos for this type (None: the BPE default, False)
    add_bos: bool | None = None
    _compiled: list[re.Pattern[str]] = field(default_factory=list, compare=False, repr=False)

    def regexes(self) -> list[re.Pattern[str]]:
        if not self._compiled:
            self._compiled.extend(re.compile(expand_classes(p)) for p in self.patterns)
        return self._compiled

    def split(self, text: str) -> list[str]:
        """The words of ``text``: matches and unmatched gaps of each regex in turn, in order."""
        pieces = [text]
        for rx in self.regexes():
            out: list[str] = []
            for piece in pieces:
                pos = 0
                for m in rx.finditer(piece):
                    start, end = m.span()
                    if start > pos:
                        out.append(piece[pos:start])
                    if end > start:
                        out.append(piece[start:end])
                    pos = end
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces


def _make(kind: str, patterns: str | tuple[str, ...], **flags: bool) -> PreTokenizer:
    return PreTokenizer(kind, (patterns,) if isinstance(patterns, str) else patterns, **flags)


_DEFAULT = _make("default", DEFAULT)
_GPT2 = _make("gpt2", GPT2)
_LLAMA3 = _make("llama3", LLAMA3, ignore_merges=True, add_bos=True)
_DBRX = _make("dbrx", LLAMA3)
_QWEN2 = _make("qwen2", QWEN2, clean_spaces=False)
_QWEN2_CLEAN = _make("qwen2", QWEN2)  # names llama.cpp maps to the qwen2 regex without clearing clean_spaces

#: ``tokenizer.ggml.pre`` value -> pre-tokenizer, for the names pyggml implements
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), _GPT2),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _LLAMA3
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _DBRX),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2),
    **dict.fromkeys(("megrez", "stablelm2"), _QWEN2_CLEAN),
}


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value; a missing (empty) name is "default"."""
    if not name:
        return _DEFAULT  # llama.cpp warns that generation quality will be degraded
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedTokenizerError(
            f"pre-tokenizer {Keys.TOKENIZER_PRE}={name!r} is not supported by pyggml (supported: {known})"
        ) from None
