"""The old home of the NN kernels, kept only for backend/cpu/jit/nn.py, which imports its ROPE and
ALiBi helpers from here; the kernels live in backend/cpu/kernels/nn.py. (jit/ is being rewritten
on another branch; its rewrite imports from kernels.nn and this module goes.)"""

from .kernels.nn import GGML_ROPE_TYPE_NEOX, alibi_slopes, rope_yarn_corr_dims

__all__ = ["GGML_ROPE_TYPE_NEOX", "alibi_slopes", "rope_yarn_corr_dims"]
