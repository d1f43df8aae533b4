"""Small vocabularies and tricky texts for checking pyggml's tokenizers against llama.cpp's token ids.

The texts mix digits, punctuation, whitespace runs, accents, CJK and emoji so that every
pre-tokenizer regex cuts them in its own places. The vocabularies are trained here with a
plain, deterministic BPE over each text *as one word* and over every two adjacent characters of
the texts and every three, so their merges cross every kind of boundary: a pre-tokenizer that cuts in a
different place gives different token ids.

``python tests/helpers/tok_reference.py LLAMA_TOKENIZE OUT_DIR`` writes GGUF files to OUT_DIR,
runs llama.cpp's ``llama-tokenize`` on them and stores the vocabularies, texts and ids in
``tests/data/tokenizers/``. The tests read only that JSON; they need no llama.cpp.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizers"  # helpers.data.DATA; this also runs as a script

TEXTS = [
    "Hello world! It's a TEST: don't, we'll, I'M, they'RE, you've, she'd. ¿Qué tal? naïve café Ünïcödé — straße",
    "Numbers: 7 42 123 1234 12345 1234567 3.14159 -0.5 1,000,000 $100 50% ٣٤٥ Ⅻ ½ ² 2024-06-01",
    "   leading\tspaces\n\n\nnewlines\r\n\r\n  indent\n        eight spaces\u00a0nbsp\u3000ideo\u2009thin"
    "   trailing   ",
    "日本語のテキスト、中文文本。한국어 텍스트 カタカナ ｈａｌｆ ﾊﾝｶｸ 𠀀𠀁 ไทย ລາວ ខ្មែរ",
    "emoji 😀🎉👍🏽 👨‍👩‍👧 ∑∫√≤≥ ←→ ★ ©®™ €£¥ e\u0301 \u0915\u094d\u0937 \u0645\u0631\u062d\u0628\u0627"
    " ǅungla CamelCase HTTPServer",
    "def f(x):\n    return x**2  # sq\n<sentinel:12> IMGIMGABZ path/to/file.txt user@mail.org {a:[1,2]} ...!!! ??",
    "İstanbul'da Ankara'ya gittim; O'Neil's \x1cfs\x85nel\u200dzwj\ufeffbom",
]

# GPT-2's byte -> character table, written out here so the reference does not depend on pyggml
_KEEP = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
BYTE_CHARS = [chr(b) if b in _KEEP else "" for b in range(256)]
_moved = 0
for _b in range(256):
    if not BYTE_CHARS[_b]:
        BYTE_CHARS[_b] = chr(0x100 + _moved)
        _moved += 1


def byte_level(text: str) -> str:
    return "".join(BYTE_CHARS[b] for b in text.encode("utf-8"))


def train(sequences: list[list[str]], n_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE: merge the most frequent adjacent pair (ties: the smallest pair), ``n_merges`` times."""
    seqs = [list(s) for s in sequences]
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts: Counter[tuple[str, str]] = Counter()
        for s in seqs:
            counts.update(itertools.pairwise(s))
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], tuple(-ord(c) for c in kv[0][0] + "\0" + kv[0][1])))[0]
        merges.append(best)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if (s[i], s[i + 1]) == best:
                    s[i : i + 2] = [s[i] + s[i + 1]]
                i += 1
    return merges


def bpe_vocab(raw: bool, words: list[str], n_merges: int = 5000) -> dict[str, Any]:
    """A byte-level vocabulary (raw=False) or a SentencePiece-style one with ``<0xXX>`` tokens (raw=True).

    ``words`` are trained as well (the words some pre-tokenizer cuts the texts into), so that
    each of them can become one token and a different cut shows in the ids.
    """
    pairs = sorted({t[i : i + n] for t in TEXTS for n in (2, 3) for i in range(len(t) - n + 1)} | set(words))
    if raw:
        seqs = [list(t.replace(" ", "\u2581")) for t in [*TEXTS, *pairs]]
        tokens = [f"<0x{b:02X}>" for b in range(256)]
        types = [6] * 256
        for ch in sorted({c for s in seqs for c in s}):
            tokens.append(ch)
            types.append(1)
    else:
        seqs = [list(byte_level(t)) for t in [*TEXTS, *pairs]]
        tokens = list(BYTE_CHARS)
        types = [1] * 256
    merges = train(seqs, n_merges)
    known = set(tokens)
    for a, b in merges:
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
            types.append(1)
    return {"tokens": tokens, "token_type": types, "merges": [f"{a} {b}" for a, b in merges]}


def bpe_metadata(vocab: dict[str, Any], pre: str) -> dict[str, Any]:
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": vocab["tokens"],
        "tokenizer.ggml.token_type": vocab["token_type"],
        "tokenizer.ggml.merges": vocab["merges"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }


def write_gguf(path: Path, metadata: dict[str, Any]) -> None:
    """A vocab-only GGUF (no tensors) with gguf-py, as llama.cpp's converter would write these keys."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch=metadata["general.architecture"])
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, bytes):
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
        elif value and isinstance(value[0], str):
            w.add_array(key, value)
        elif value and isinstance(value[0], float):
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
        else:
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_tokenize(exe: str, model: Path, text: str, work: Path) -> list[int] | None:
    """llama.cpp's ids for ``text`` with add_special=false, parse_special=false; None where llama.cpp aborts.

    (llama.cpp asserts that no merge candidate holds a space, which a raw-UTF-8 vocabulary
    without space escaping, the "whitespace" pre-tokenizer, hits on runs of whitespace.)
    """
    src = work / "text.txt"
    src.write_bytes(text.encode("utf-8"))
    res = subprocess.run(
        [exe, "-m", str(model), "-f", str(src), "--ids", "--no-bos", "--no-escape", "--log-disable"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def make_bpe_reference(exe: str, work: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pyggml.llm.tokenizer.pretokenize import PRE_TOKENIZERS

    words = sorted({w for p in PRE_TOKENIZERS.values() for t in TEXTS for w in p.split(t)})
    vocabs = {"byte_level": bpe_vocab(False, words), "raw": bpe_vocab(True, words)}
    cases = []
    for pre in ["", *PRE_TOKENIZERS]:
        which = "raw" if PRE_TOKENIZERS.get(pre) is not None and not PRE_TOKENIZERS[pre].byte_encode else "byte_level"
        md = bpe_metadata(vocabs[which], pre)
        if not pre:
            del md["tokenizer.ggml.pre"]
        model = work / f"bpe-{pre or 'none'}.gguf"
        write_gguf(model, md)
        cases.append({"pre": pre, "vocab": which, "ids": [llama_tokenize(exe, model, t, work) for t in TEXTS]})
    out = {"llama_cpp": "0c1e570", "texts": TEXTS, "vocabs": vocabs, "cases": cases}
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "bpe_pre.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", "utf-8")


# ---- WPM, UGM and RWKV vocabularies ----------------------------------------------------------

_WORD = re.compile(r"\w+|[^\w\s]")


def _words() -> list[str]:
    return sorted({w for t in TEXTS for w in _WORD.findall(unicodedata.normalize("NFD", t).lower())})


def wpm_metadata() -> dict[str, Any]:
    """A BERT-style vocabulary: "▁word" starts and bare continuations; words with q, z or й have no cover (UNK)."""
    pieces: set[str] = set()
    for w in _words():
        pieces.update("\u2581" + w[:k] for k in range(1, 5))
        pieces.update(w[i : i + k] for k in (1, 2, 3) for i in range(len(w) - k + 1))
    pieces = {p for p in pieces if not set(p) & set("qzй") and unicodedata.category(p[-1])[0] != "M"}
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = specials + sorted(pieces)
    return {
        "general.architecture": "bert",
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(specials) + [1] * len(pieces),
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.mask_token_id": 4,
    }


def _proto_fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) pairs of one protobuf message: varints as int, 32-bit as bytes, the rest as bytes."""
    out: list[tuple[int, Any]] = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        v, shift = 0, 0
        while True:
            b = buf[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while pos < len(buf):
        key = varint()
        field_no, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field_no, varint()))
        elif wire == 5:
            out.append((field_no, buf[pos : pos + 4]))
            pos += 4
        elif wire == 1:
            out.append((field_no, buf[pos : pos + 8]))
            pos += 8
        else:
            n = varint()
            out.append((field_no, buf[pos : pos + n]))
            pos += n
    return out


_NORMALIZATION_RULES = "".join(f"{0xFF41 + i:X}\t{0x61 + i:X}\n" for i in range(26)) + "3000\t20\n2160\t49\n"


def ugm_metadata(work: Path) -> dict[str, Any]:
    """A T5-style Unigram vocabulary trained by sentencepiece, with a small custom normalization map."""
    import io

    import sentencepiece as spm

    rules = work / "rules.tsv"
    rules.write_text(_NORMALIZATION_RULES, "utf-8")
    model = io.BytesIO()
    corpus = [*TEXTS * 4, *_words()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, model_type="unigram", vocab_size=400,
        normalization_rule_tsv=str(rules), pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        user_defined_symbols=["<extra_id_0>", "<extra>"], character_coverage=0.98, hard_vocab_limit=False,
        num_threads=1, seed_sentencepiece_size=5000, shuffle_input_sentence=False,
    )  # fmt: skip
    tokens, scores, types = [], [], []
    normalizer: dict[int, Any] = {}
    for field_no, value in _proto_fields(model.getvalue()):
        if field_no == 1:  # SentencePiece {piece, score, type}
            piece = dict(_proto_fields(value))
            tokens.append(piece[1].decode("utf-8"))
            scores.append(float(np.frombuffer(piece.get(2, b"\0\0\0\0"), "<f4")[0]))
            types.append(piece.get(3, 1))
        elif field_no == 3:  # NormalizerSpec
            normalizer = dict(_proto_fields(value))
    return {
        "general.architecture": "t5",
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": bool(normalizer.get(3, 1)),
        "tokenizer.ggml.remove_extra_whitespaces": bool(normalizer.get(4, 1)),
        "tokenizer.ggml.precompiled_charsmap": normalizer[2],
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 2,
    }


def rwkv_metadata() -> dict[str, Any]:
    """An RWKV-World-style vocabulary: every byte but 0xF0 and "q", and the texts' 2-4 byte substrings, escaped."""
    pieces = {bytes([b]) for b in range(256) if b not in (0xF0, ord("q"))}
    for t in TEXTS:
        data = t.encode("utf-8")
        pieces.update(data[i : i + k] for k in (2, 3, 4) for i in range(0, len(data) - k + 1, k - 1))
    ordered = sorted(pieces, key=lambda p: (len(p), p))
    tokens = ["<s>", *(repr(p)[2:-1] for p in ordered)]  # the converter's escaping
    return {
        "general.architecture": "rwkv6",
        "tokenizer.ggml.model": "rwkv",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * len(ordered),
        "tokenizer.ggml.unknown_token_id": 0,
    }


def make_model_reference(exe: str, work: Path) -> None:
    models = {"wpm": wpm_metadata(), "ugm": ugm_metadata(work), "rwkv": rwkv_metadata()}
    cases = {}
    for name, md in models.items():
        path = work / f"{name}.gguf"
        write_gguf(path, md)
        ids = [llama_tokenize(exe, path, t, work) for t in TEXTS]
        stored = dict(md)
        if isinstance(stored.get("tokenizer.ggml.precompiled_charsmap"), bytes):
            stored["tokenizer.ggml.precompiled_charsmap"] = stored["tokenizer.ggml.precompiled_charsmap"].hex()
        cases[name] = {"metadata": stored, "ids": ids}
    out = {"llama_cpp": "0c1e570", "texts": TEXTS, "models": cases}
    (DATA / "models.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", "utf-8")


if __name__ == "__main__":
    make_bpe_reference(sys.argv[1], Path(sys.argv[2]))
    make_model_reference(sys.argv[1], Path(sys.argv[2]))
