r"""BPE pre-tokenizers: how ``tokenizer.ggml.pre`` splits text into words before merging.

llama.cpp maps each ``tokenizer.ggml.pre`` value to a pre-tokenizer type and some vocab flags
(``llama_vocab::impl::load``), and each type to a list of regexes (``llm_tokenizer_bpe``). The
regexes below are llama.cpp's, character for character, because llama.cpp picks how to run a
regex (a hand-written splitter or ``std::regex``) by comparing its text; see
:mod:`.regex_split`. Several types share a regex list; the names are kept so that messages and
``Vocab.pre`` say which one a model uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf.constants import Keys
from .errors import UnsupportedTokenizerError
from .regex_split import Step, compile_step, regex_split

# ---- the regexes (llm_tokenizer_bpe), as llama.cpp writes them -----------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")  # fmt: skip
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
NEWLINES = r"[^\n]+|[\n]+"

# the Unicode-aware "words with a case" regex of GPT-4o / Tekken, as llama.cpp rewrites it
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
# (llama.cpp writes \r and \n here as the characters themselves, so they are in plain strings)
_DEEPSEEK3_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|""" "[^\r\n" r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                   r"| ?[\p{P}\p{S}]+" "[\r\n]*|" r"\s*" "[\r\n]+|" r"\s+(?!\S)|\s+")  # fmt: skip
# AFMoE's copy spells \r and \n as escapes
_AFMOE_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
               r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_GPT4O = (r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?" + _UPPER + "+" + _LOWER + "*" + _CONTRACTIONS + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_UPPER_M, _LOWER_M = r"((?=[\p{L}\p{M}])([^a-z]))", r"((?=[\p{L}\p{M}])([^A-Z]))"
_GRANITE_EMB = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_M + "*" + _LOWER_M + "+" + _CONTRACTIONS + "?"
                r"|[^\r\n\p{L}\p{N}]?" + _UPPER_M + "+" + _LOWER_M + "*" + _CONTRACTIONS + "?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"
_STARCODER = (r"\p{N}", GPT2)

#: LLAMA_VOCAB_PRE_TYPE_* (lower case, without the prefix) -> its regexes
REGEXES: dict[str, tuple[str, ...]] = {
    "default": DEFAULT,
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
              r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "dbrx": (LLAMA3,),
    "smaug": (LLAMA3,),
    "deepseek_llm": (
        "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ),
    "deepseek3_llm": (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_MAIN),
    "spark2_5": (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_MAIN.replace("+[\r\n]*|\\s*[\r\n]+|", "+|[\r\n]|", 1),
                 r"\p{N}"),
    "youtu": ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
              _CASED.replace(r"|\p{N}{1,3}|", r"|\p{N}|", 1)),
    "deepseek_coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "starcoder": _STARCODER,
    "refact": _STARCODER,
    "command_r": _STARCODER,
    "smollm": _STARCODER,
    "codeshell": _STARCODER,
    "exaone": _STARCODER,
    "minerva": _STARCODER,
    "mellum2": _STARCODER,
    "gpt2": (GPT2,),
    "mpt": (GPT2,),
    "olmo": (GPT2,),
    "jais": (GPT2,),
    "trillion": (GPT2,),
    "granite_docling": (GPT2,),
    "stablelm2": (QWEN2,),
    "qwen2": (QWEN2,),
    "hunyuan": (QWEN2,),
    "solar_open": (QWEN2,),
    "qwen35": (QWEN35,),
    "poro": (_BLOOM,),
    "bloom": (_BLOOM,),
    "gpt3_finnish": (_BLOOM,),
    "chatglm4": (LLAMA3,),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+|[^\\r\\n\\p{L}\\p{N}]?" + _UPPER + "+" + _LOWER
               + r"*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "chameleon": ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": (_GPT4O,),
    "minimax_m2": (_GPT4O,),
    "granite_emb_multi": (_GRANITE_EMB,),
    "tiny_aya": (r"\d{1,3}(?=(?:\d{3})*\b)", _CASED),
    "kimi_k2": (r"\p{Han}+",),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed_coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL,),
    "grok_2": (QWEN2,),
    "afmoe": (r"\p{AFMoE_digits}", "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+", _AFMOE_MAIN),
    "laguna": (NEWLINES, QWEN2),
    "exaone_moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "gemma4": (NEWLINES,),
    "sarvam_moe": (NEWLINES,),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+" + _TAIL),
    "whitespace": (r"\S+",),
}  # fmt: skip
# deepseek-v3's regex list is shared by hunyuan-dense, joyai-llm and hy_v4
for _kind in ("hunyuan_dense", "joyai_llm", "hy_v4"):
    REGEXES[_kind] = REGEXES["deepseek3_llm"]

#: types whose words are raw UTF-8 (SentencePiece-style BPE), not GPT-2 byte-level text
_NO_BYTE_ENCODE = frozenset(("gemma4", "sarvam_moe", "whitespace"))


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type and the vocab flags that come with its name."""

    kind: str  #: llama.cpp's LLAMA_VOCAB_PRE_TYPE_* name, lower case, without the prefix
    #: a word that is itself a token is emitted whole, without running the merges
    ignore_merges: bool = False
    #: detokenize removes spaces before punctuation and some contractions
    clean_spaces: bool = True
    #: the default add_bos for this name (None: the BPE default, False)
    add_bos: bool | None = None
    #: add_sep: a SEP token ends the text (RoBERTa-style encoders)
    add_sep: bool = False
    #: spaces become U+2581 before splitting (SentencePiece-style BPE)
    escape_whitespaces: bool = False
    #: the BOS id defaults to "none" instead of BPE's 11 (ChatGLM/GLM)
    no_bos: bool = False
    _steps: list[Step] = field(default_factory=list, compare=False, repr=False)

    @property
    def patterns(self) -> tuple[str, ...]:
        """llama.cpp's regexes for this type, applied in order."""
        return REGEXES[self.kind]

    @property
    def byte_encode(self) -> bool:
        """Whether words are mapped to GPT-2 byte-level characters before merging."""
        return self.kind not in _NO_BYTE_ENCODE

    def split(self, text: str) -> list[str]:
        """The words of ``text`` (not yet byte-encoded), as llama.cpp's ``unicode_regex_split`` cuts it."""
        if not self._steps:
            self._steps.extend(compile_step(p) for p in self.patterns)
        return regex_split(text, tuple(self._steps))


def _make(kind: str, **flags: bool) -> PreTokenizer:
    if kind not in REGEXES:
        raise AssertionError(f"pre-tokenizer type {kind!r} has no regexes")
    return PreTokenizer(kind, **flags)


_DEFAULT = _make("default")
_GPT2 = _make("gpt2")
_LLAMA3 = _make("llama3", ignore_merges=True, add_bos=True)
_QWEN2 = _make("qwen2", clean_spaces=False)
_GEMMA4 = _make("gemma4", escape_whitespaces=True)
_UNCLEAN = ("deepseek_llm", "deepseek_coder", "deepseek3_llm", "spark2_5", "command_r", "qwen35", "poro", "viking",
            "smollm", "gpt4o", "tiny_aya", "superbpe", "trillion", "granite_docling", "bailingmoe", "seed_coder",
            "hunyuan", "hunyuan_dense", "hy_v4", "joyai_llm", "kimi_k2", "ufakzeka", "grok_2", "afmoe", "laguna",
            "minimax_m2", "solar_open")  # fmt: skip
_SIMPLE = {kind: _make(kind, clean_spaces=kind not in _UNCLEAN) for kind in REGEXES}

#: ``tokenizer.ggml.pre`` value -> pre-tokenizer, in the order of llama.cpp's ``if`` chain
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    "minicpm5": _make("minicpm5", ignore_merges=True),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), _LLAMA3),
    "deepseek-llm": _SIMPLE["deepseek_llm"],
    "deepseek-coder": _SIMPLE["deepseek_coder"],
    "deepseek-v3": _SIMPLE["deepseek3_llm"],
    "spark2_5": _SIMPLE["spark2_5"],
    "youtu": _make("youtu", clean_spaces=False, ignore_merges=True),
    "falcon": _SIMPLE["falcon"],
    "mpt": _SIMPLE["mpt"],
    "starcoder": _SIMPLE["starcoder"],
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert"), _GPT2),
    "jais-2": _SIMPLE["jais2"],
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m"), _GEMMA4),
    "sarvam-moe": _make("sarvam_moe", escape_whitespaces=True, clean_spaces=False),
    **dict.fromkeys(("jina-v1-en", "jina-v2-code", "roberta-bpe"), _make("gpt2", add_sep=True)),
    "whitespace": _SIMPLE["whitespace"],
    "refact": _SIMPLE["refact"],
    "command-r": _SIMPLE["command_r"],
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), _QWEN2),
    "qwen35": _SIMPLE["qwen35"],
    "stablelm2": _SIMPLE["stablelm2"],
    "olmo": _SIMPLE["olmo"],
    "dbrx": _SIMPLE["dbrx"],
    "smaug-bpe": _SIMPLE["smaug"],
    "poro-chat": _SIMPLE["poro"],
    "chatglm-bpe": _make("chatglm4", no_bos=True),
    **dict.fromkeys(("glm4", "glm5"), _make("chatglm4", no_bos=True, ignore_merges=True)),
    "viking": _SIMPLE["viking"],
    "jais": _SIMPLE["jais"],
    "tekken": _make("tekken", clean_spaces=False, ignore_merges=True, add_bos=True),
    "smollm": _SIMPLE["smollm"],
    "codeshell": _SIMPLE["codeshell"],
    "bloom": _SIMPLE["bloom"],
    "gpt3-finnish": _SIMPLE["gpt3_finnish"],
    "exaone": _SIMPLE["exaone"],
    "exaone4": _GPT2,
    "exaone-moe": _SIMPLE["exaone_moe"],
    "chameleon": _make("chameleon", add_bos=True, clean_spaces=False),
    "minerva-7b": _SIMPLE["minerva"],
    "megrez": _make("qwen2"),  # the qwen2 regex, but clean_spaces stays on
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie"), _SIMPLE["gpt4o"]),
    "granite-embed-multi-97m": _make("granite_emb_multi", clean_spaces=False, ignore_merges=True),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), _SIMPLE["tiny_aya"]),
    "superbpe": _SIMPLE["superbpe"],
    "trillion": _SIMPLE["trillion"],
    "granite-docling": _SIMPLE["granite_docling"],
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _SIMPLE["bailingmoe"]),
    "seed-coder": _SIMPLE["seed_coder"],
    "hunyuan": _SIMPLE["hunyuan"],
    "hunyuan-dense": _SIMPLE["hunyuan_dense"],
    "hy_v4": _SIMPLE["hy_v4"],
    "joyai-llm": _SIMPLE["joyai_llm"],
    "kimi-k2": _SIMPLE["kimi_k2"],
    "ufakzeka": _SIMPLE["ufakzeka"],
    "grok-2": _SIMPLE["grok_2"],
    "afmoe": _SIMPLE["afmoe"],
    "laguna": _SIMPLE["laguna"],
    "minimax-m2": _SIMPLE["minimax_m2"],
    "solar-open": _SIMPLE["solar_open"],
    "mellum2": _SIMPLE["mellum2"],
}  # fmt: skip


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value; a missing (empty) name is "default"."""
    if not name:
        return _DEFAULT  # llama.cpp warns that generation quality will be degraded
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        raise UnsupportedTokenizerError(
            f"unknown pre-tokenizer type {Keys.TOKENIZER_PRE}={name!r}: llama.cpp 0c1e570 does not know it either"
        ) from None
