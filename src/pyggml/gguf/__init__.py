"""GGUF files: a validating, zero-copy reader, an atomic streaming writer, ggml's ``gguf_*`` API.

r = GGUFReader("model.gguf")          # every ggml check; GGUFError names the one that failed
r.get_u32("gemma3.block_count"); r["tokenizer.ggml.tokens"][5]
r.tensor_data("token_embd.weight")    # read-only numpy view of the mapped file

w = GGUFWriter(); w.set_str("general.architecture", "llama")
w.add_tensor("x", np.zeros((2, 32), np.float32)); w.write("out.gguf")
"""

from __future__ import annotations

from .api import *  # noqa: F403  (ggml's flat gguf_* functions)
from .api import __all__ as _api_all
from .constants import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_KEY_GENERAL_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    GGUFValueType,
    Keys,
)
from .context import GGUFContext
from .errors import CHECKS, GGUFError, GGUFKeyError, GGUFTypeError
from .reader import GGUFReader
from .records import GGUFKV, StringArray, TensorInfo
from .writer import GGUFWriter

__all__ = [
    "CHECKS",
    "GGML_MAX_DIMS",
    "GGML_MAX_NAME",
    "GGUFKV",
    "GGUF_DEFAULT_ALIGNMENT",
    "GGUF_KEY_GENERAL_ALIGNMENT",
    "GGUF_MAGIC",
    "GGUF_VERSION",
    "GGUFContext",
    "GGUFError",
    "GGUFKeyError",
    "GGUFReader",
    "GGUFTypeError",
    "GGUFValueType",
    "GGUFWriter",
    "Keys",
    "StringArray",
    "TensorInfo",
    *_api_all,
]
