"""GGUF metadata keys: spelled once, in pyggml.gguf.constants.Keys, as llama.cpp and gguf-py spell them."""

from __future__ import annotations

import ast
import re

import gguf

from helpers import data
from pyggml.gguf.constants import Keys

SRC = data.SRC / "pyggml"


def test_each_key_once() -> None:
    values = [v for k, v in vars(Keys).items() if k.isupper()]
    assert len(values) == len(set(values))


def test_keys_match_gguf_py() -> None:
    """Checked against the independent gguf package (gguf-py), with literals where it has no name."""
    g = gguf.Keys
    pairs = [
        (Keys.GENERAL_ARCHITECTURE, g.General.ARCHITECTURE), (Keys.GENERAL_FILE_TYPE, g.General.FILE_TYPE),
        (Keys.GENERAL_QUANTIZATION_VERSION, g.General.QUANTIZATION_VERSION), (Keys.GENERAL_NAME, g.General.NAME),
        (Keys.CONTEXT_LENGTH, g.LLM.CONTEXT_LENGTH), (Keys.BLOCK_COUNT, g.LLM.BLOCK_COUNT),
        (Keys.ATTENTION_HEAD_COUNT_KV, g.Attention.HEAD_COUNT_KV),
        (Keys.ATTENTION_LAYERNORM_RMS_EPS, g.Attention.LAYERNORM_RMS_EPS),
        (Keys.ROPE_SCALING_ORIG_CTX_LEN, g.Rope.SCALING_ORIG_CTX_LEN), (Keys.ROPE_FREQ_BASE, g.Rope.FREQ_BASE),
        (Keys.TOKENIZER_LIST, g.Tokenizer.LIST), (Keys.TOKENIZER_SEP_ID, g.Tokenizer.SEP_ID),
        (Keys.TOKENIZER_CHAT_TEMPLATE, g.Tokenizer.CHAT_TEMPLATE),
        (Keys.SPLIT_TENSORS_COUNT, g.Split.LLM_KV_SPLIT_TENSORS_COUNT), (Keys.IMATRIX_CHUNK_SIZE, g.IMatrix.CHUNK_SIZE),
        (Keys.QUANTIZE_IMATRIX_N_CHUNKS, "quantize.imatrix.chunks_count"),
    ]
    for ours, theirs in pairs:
        assert ours == theirs
    assert Keys.arch(Keys.BLOCK_COUNT, "gemma3") == "gemma3.block_count"


#: a whole string that is a key, or the tail of an f-string key (f"{arch}.block_count")
_KEY_RE = re.compile(r"^(general|tokenizer\.ggml|tokenizer|split|quantize\.imatrix|imatrix)\.[a-z_]+$")
_ARCH_TAIL_RE = re.compile(r"^\.(block_count|context_length|embedding_length|feed_forward_length|expert_count|"
                           r"vocab_size|attention\.[a-z_]+|rope\.[a-z_.]+)$")
_FILE_NAMES = {"tokenizer.json", "imatrix.gguf"}  # look like keys, are file names


def test_no_key_literals_outside_constants() -> None:
    """Code strings (docstrings aside) that are GGUF keys live only in gguf/constants.py."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "constants.py" and path.parent.name == "gguf":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        tails = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            whole = _KEY_RE.match(node.value) and node.value not in _FILE_NAMES
            if whole or (id(node) in tails and _ARCH_TAIL_RE.match(node.value)):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    assert not found, "GGUF key literals outside gguf/constants.py:\n" + "\n".join(found)
