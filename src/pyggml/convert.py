"""Moved to pyggml/tensor_data.py. Kept only for backend/cpu/qmatmul.py and actquant.py, which import
the bf16 helpers from here inside functions and are being rewritten on another branch; their
rewrite imports from quants.fp (or tensor_data) and this module goes."""

from .tensor_data import bf16_to_f32, f32_to_bf16

__all__ = ["bf16_to_f32", "f32_to_bf16"]
