"""GGUF files: a validating, zero-copy reader, an atomic streaming writer, ggml's ``gguf_*`` API.

r = GGUFReader("model.gguf")          # every ggml check; GGUFError names the one that failed
r.get_u32("gemma3.block_count"); r["tokenizer.ggml.tokens"][5]
r.tensor_data("token_embd.weight")    # read-only numpy view of the mapped file

w = GGUFWriter(); w.set_str("general.architecture", "llama")
w.add_tensor("x", np.zeros((2, 32), np.float32)); w.write("out.gguf")
"""

from __future__ import annotations

from . import api, constants
from .api import *  # noqa: F403  (ggml's flat gguf_* functions)
from .constants import *  # noqa: F403  (gguf.h's header constants, GGUFValueType, Keys)
from .context import GGUFContext
from .errors import CHECKS, GGUFError, GGUFKeyError, GGUFTypeError
from .reader import GGUFReader
from .records import GGUFKV, StringArray, TensorInfo
from .writer import GGUFWriter

__all__ = [
    "CHECKS",
    "GGUFKV",
    "GGUFContext",
    "GGUFError",
    "GGUFKeyError",
    "GGUFReader",
    "GGUFTypeError",
    "GGUFWriter",
    "StringArray",
    "TensorInfo",
    *constants.__all__,
    *api.__all__,
]
