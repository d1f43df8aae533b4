"""llama.cpp's quantization tools: ``quantize_model`` (llama-quantize) and importance matrices (llama-imatrix).

quantize_model("model-f16.gguf", "model-q4_k_m.gguf", "Q4_K_M")
quantize_model("f16.gguf", "iq2.gguf", "IQ2_XS", QuantizeOptions(imatrix="imatrix.gguf"))
"""

from __future__ import annotations

from .driver import QuantizeOptions, QuantizeResult, TensorPlan, model_info, quantize_model
from .errors import QuantizeError
from .ftypes import QUANT_OPTIONS, LlamaFType, QuantOption, ftype_default_type, parse_ftype
from .imatrix import IMatrixCollector
from .imatrix_io import IMatrix, IMatrixEntry, load_imatrix, save_imatrix
from .overrides import KVOverride, parse_kv_override, parse_prune_layers, parse_tensor_type, parse_tensor_type_file

__all__ = [
    "QUANT_OPTIONS",
    "IMatrix",
    "IMatrixCollector",
    "IMatrixEntry",
    "KVOverride",
    "LlamaFType",
    "QuantOption",
    "QuantizeError",
    "QuantizeOptions",
    "QuantizeResult",
    "TensorPlan",
    "ftype_default_type",
    "load_imatrix",
    "model_info",
    "parse_ftype",
    "parse_kv_override",
    "parse_prune_layers",
    "parse_tensor_type",
    "parse_tensor_type_file",
    "quantize_model",
    "save_imatrix",
]
