"""Tiny byte-level BPE tokenizers trained with HF ``tokenizers``, and their GGUF metadata.

Each tokenizer is configured as the HF ``tokenizer.json`` of the real model family is: a
``Split`` on the model's regex (isolated) then ``ByteLevel`` without its own regex, and for
Qwen2 an NFC normalizer. The metadata is what llama.cpp's converter writes for such a
tokenizer (``get_vocab_base`` + ``SpecialVocab``): tokens in id order, CONTROL for special
added tokens, USER_DEFINED for other added tokens, merges as "left right" strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# the regexes exactly as in the models' tokenizer.json files
_HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = _HEAD + r"\p{N}{1,3}" + _TAIL
QWEN2_REGEX = _HEAD + r"\p{N}" + _TAIL

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they'd said; we'll see, you're right, I've got it.",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000 2024-06-01 10:30 v1.2.3",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "naïve café résumé déjà vu — Ünïcödé façade; Straße, São Paulo, Kraków, İstanbul",
    "日本語のテキストと中文文本。한국어 텍스트도 있어요. Русский текст и ελληνικά γράμματα.",
    "emoji 😀🎉👍🏽 and symbols ∑∫√ ≤≥ ← → ★ © ® ™ € £ ¥",
    "tabs\tand\nnewlines\r\n\r\n  indented\n\n\n    more   spaces   here  ",
    "https://example.com/path?q=1&r=2 user@mail.org #hashtag @mention $100 50% (a+b)*c [x] {y}",
    "SHOUTING WORDS AND CamelCase and snake_case and kebab-case and dot.separated.words",
    "I'M DONE. YOU'RE LATE. THEY'VE GONE. HE'LL COME. SHE'D KNOW. IT'S FINE. DON'T!",
] * 3


@dataclass
class BPEFixture:
    hf: Tokenizer
    metadata: dict[str, Any]
    specials: list[str]


def _does_look_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")


def configure(tok: Tokenizer, kind: str) -> Tokenizer:
    """Give ``tok`` the normalizer, pre-tokenizer and decoder of the model family ``kind``."""
    regex = LLAMA3_REGEX if kind == "llama3" else QWEN2_REGEX
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train(kind: str, vocab_size: int = 700) -> BPEFixture:
    """A trained tokenizer of ``kind`` "llama3" or "qwen2" and its GGUF metadata."""
    tok = configure(Tokenizer(models.BPE()), kind)
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "llama3":  # Llama 3's tokenizer.json sets ignore_merges
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_tokens(["<custom_tag>"])  # a non-special added token: USER_DEFINED in GGUF
    return BPEFixture(tok, to_metadata(tok, kind), [*specials, "<custom_tag>"])


def to_metadata(tok: Tokenizer, kind: str) -> dict[str, Any]:
    """The tokenizer.* keys llama.cpp's converter writes for ``tok``."""
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    n = max(vocab.values()) + 1
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(5)  # UNUSED
        elif i in added:
            a = added[i]
            tokens.append(by_id[i] if a.special or _does_look_special(by_id[i]) else by_id[i].replace("\u2581", " "))
            types.append(3 if a.special or _does_look_special(by_id[i]) else 4)  # CONTROL / USER_DEFINED
        else:
            tokens.append(by_id[i])
            types.append(1)  # NORMAL
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    md: dict[str, Any] = {
        "general.architecture": "llama" if kind == "llama3" else "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe" if kind == "llama3" else "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    bos, eos = ("<|begin_of_text|>", "<|end_of_text|>") if kind == "llama3" else ("<|endoftext|>", "<|im_end|>")
    if bos in vocab:
        md["tokenizer.ggml.bos_token_id"] = vocab[bos]
    if eos in vocab:
        md["tokenizer.ggml.eos_token_id"] = vocab[eos]
    if kind == "qwen2":
        if bos in vocab:
            md["tokenizer.ggml.padding_token_id"] = vocab[bos]
        md["tokenizer.ggml.add_bos_token"] = False
    return md
