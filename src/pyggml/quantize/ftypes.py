"""llama.cpp's file types (``llama_ftype``): names, numbers and the tensor type each defaults to.

A file type is a *mix*: ``Q4_K_M`` says "Q4_K by default, with the bumps of
``llama_tensor_get_type``". The table follows llama-quantize's ``QUANT_OPTIONS`` (its order decides
which name a number prints as, e.g. 7 is ``Q8_0`` and 0 is ``F32``, not ``COPY``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ..types import GGMLType
from .errors import QuantizeError


class LlamaFType(IntEnum):
    """``enum llama_ftype`` (include/llama.h); numbers are what ``general.file_type`` stores."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    MOSTLY_Q2_0 = 41


#: ``ftype | LLAMA_FTYPE_GUESSED`` marks a file type inferred from the tensors
LLAMA_FTYPE_GUESSED = 1024

F = LlamaFType


@dataclass(frozen=True)
class QuantOption:
    """One row of llama-quantize's table of allowed types."""

    name: str
    ftype: LlamaFType
    desc: str


QUANT_OPTIONS: tuple[QuantOption, ...] = (
    QuantOption("Q1_0", F.MOSTLY_Q1_0, " 1.125 bpw quantization"),
    QuantOption("Q2_0", F.MOSTLY_Q2_0, " 2.25 bpw quantization (group 64)"),
    QuantOption("Q4_0", F.MOSTLY_Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    QuantOption("Q4_1", F.MOSTLY_Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    QuantOption("MXFP4_MOE", F.MOSTLY_MXFP4_MOE, " MXFP4 MoE"),
    QuantOption("Q5_0", F.MOSTLY_Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    QuantOption("Q5_1", F.MOSTLY_Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    QuantOption("IQ2_XXS", F.MOSTLY_IQ2_XXS, " 2.06 bpw quantization"),
    QuantOption("IQ2_XS", F.MOSTLY_IQ2_XS, " 2.31 bpw quantization"),
    QuantOption("IQ2_S", F.MOSTLY_IQ2_S, " 2.5  bpw quantization"),
    QuantOption("IQ2_M", F.MOSTLY_IQ2_M, " 2.7  bpw quantization"),
    QuantOption("IQ1_S", F.MOSTLY_IQ1_S, " 1.56 bpw quantization"),
    QuantOption("IQ1_M", F.MOSTLY_IQ1_M, " 1.75 bpw quantization"),
    QuantOption("TQ1_0", F.MOSTLY_TQ1_0, " 1.69 bpw ternarization"),
    QuantOption("TQ2_0", F.MOSTLY_TQ2_0, " 2.06 bpw ternarization"),
    QuantOption("Q2_K", F.MOSTLY_Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    QuantOption("Q2_K_S", F.MOSTLY_Q2_K_S, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    QuantOption("IQ3_XXS", F.MOSTLY_IQ3_XXS, " 3.06 bpw quantization"),
    QuantOption("IQ3_S", F.MOSTLY_IQ3_S, " 3.44 bpw quantization"),
    QuantOption("IQ3_M", F.MOSTLY_IQ3_M, " 3.66 bpw quantization mix"),
    QuantOption("Q3_K", F.MOSTLY_Q3_K_M, "alias for Q3_K_M"),
    QuantOption("IQ3_XS", F.MOSTLY_IQ3_XS, " 3.3 bpw quantization"),
    QuantOption("Q3_K_S", F.MOSTLY_Q3_K_S, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    QuantOption("Q3_K_M", F.MOSTLY_Q3_K_M, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    QuantOption("Q3_K_L", F.MOSTLY_Q3_K_L, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    QuantOption("IQ4_NL", F.MOSTLY_IQ4_NL, " 4.50 bpw non-linear quantization"),
    QuantOption("IQ4_XS", F.MOSTLY_IQ4_XS, " 4.25 bpw non-linear quantization"),
    QuantOption("Q4_K", F.MOSTLY_Q4_K_M, "alias for Q4_K_M"),
    QuantOption("Q4_K_S", F.MOSTLY_Q4_K_S, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    QuantOption("Q4_K_M", F.MOSTLY_Q4_K_M, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    QuantOption("Q5_K", F.MOSTLY_Q5_K_M, "alias for Q5_K_M"),
    QuantOption("Q5_K_S", F.MOSTLY_Q5_K_S, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    QuantOption("Q5_K_M", F.MOSTLY_Q5_K_M, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    QuantOption("Q6_K", F.MOSTLY_Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    QuantOption("Q8_0", F.MOSTLY_Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    QuantOption("F16", F.MOSTLY_F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    QuantOption("BF16", F.MOSTLY_BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    QuantOption("F32", F.ALL_F32, "26.00G              @ 7B"),
    # COPY after F32, so that the number 0 names F32
    QuantOption("COPY", F.ALL_F32, "only copy tensors, no quantizing"),
)

_DEFAULT_TYPE: dict[LlamaFType, GGMLType] = {
    F.MOSTLY_Q4_0: GGMLType.Q4_0,
    F.MOSTLY_Q4_1: GGMLType.Q4_1,
    F.MOSTLY_Q5_0: GGMLType.Q5_0,
    F.MOSTLY_Q5_1: GGMLType.Q5_1,
    F.MOSTLY_Q8_0: GGMLType.Q8_0,
    F.MOSTLY_F16: GGMLType.F16,
    F.MOSTLY_BF16: GGMLType.BF16,
    F.ALL_F32: GGMLType.F32,
    F.MOSTLY_Q1_0: GGMLType.Q1_0,
    F.MOSTLY_Q2_0: GGMLType.Q2_0,
    F.MOSTLY_MXFP4_MOE: GGMLType.MXFP4,
    F.MOSTLY_Q2_K_S: GGMLType.Q2_K,
    F.MOSTLY_Q2_K: GGMLType.Q2_K,
    F.MOSTLY_IQ3_XS: GGMLType.IQ3_S,
    F.MOSTLY_Q3_K_S: GGMLType.Q3_K,
    F.MOSTLY_Q3_K_M: GGMLType.Q3_K,
    F.MOSTLY_Q3_K_L: GGMLType.Q3_K,
    F.MOSTLY_Q4_K_S: GGMLType.Q4_K,
    F.MOSTLY_Q4_K_M: GGMLType.Q4_K,
    F.MOSTLY_Q5_K_S: GGMLType.Q5_K,
    F.MOSTLY_Q5_K_M: GGMLType.Q5_K,
    F.MOSTLY_Q6_K: GGMLType.Q6_K,
    F.MOSTLY_TQ1_0: GGMLType.TQ1_0,
    F.MOSTLY_TQ2_0: GGMLType.TQ2_0,
    F.MOSTLY_IQ2_XXS: GGMLType.IQ2_XXS,
    F.MOSTLY_IQ2_XS: GGMLType.IQ2_XS,
    F.MOSTLY_IQ2_S: GGMLType.IQ2_XS,
    F.MOSTLY_IQ2_M: GGMLType.IQ2_S,
    F.MOSTLY_IQ3_XXS: GGMLType.IQ3_XXS,
    F.MOSTLY_IQ1_S: GGMLType.IQ1_S,
    F.MOSTLY_IQ1_M: GGMLType.IQ1_M,
    F.MOSTLY_IQ4_NL: GGMLType.IQ4_NL,
    F.MOSTLY_IQ4_XS: GGMLType.IQ4_XS,
    F.MOSTLY_IQ3_S: GGMLType.IQ3_S,
    F.MOSTLY_IQ3_M: GGMLType.IQ3_S,
}

#: the loader's guess of a file type from its most common tensor type (llama_model_loader)
_GUESS: dict[GGMLType, LlamaFType] = {
    GGMLType.F32: F.ALL_F32,
    GGMLType.F16: F.MOSTLY_F16,
    GGMLType.BF16: F.MOSTLY_BF16,
    GGMLType.Q4_0: F.MOSTLY_Q4_0,
    GGMLType.Q4_1: F.MOSTLY_Q4_1,
    GGMLType.Q5_0: F.MOSTLY_Q5_0,
    GGMLType.Q5_1: F.MOSTLY_Q5_1,
    GGMLType.Q8_0: F.MOSTLY_Q8_0,
    GGMLType.Q2_K: F.MOSTLY_Q2_K,
    GGMLType.Q3_K: F.MOSTLY_Q3_K_M,
    GGMLType.Q4_K: F.MOSTLY_Q4_K_M,
    GGMLType.Q5_K: F.MOSTLY_Q5_K_M,
    GGMLType.Q6_K: F.MOSTLY_Q6_K,
    GGMLType.TQ1_0: F.MOSTLY_TQ1_0,
    GGMLType.TQ2_0: F.MOSTLY_TQ2_0,
    GGMLType.IQ2_XXS: F.MOSTLY_IQ2_XXS,
    GGMLType.IQ2_XS: F.MOSTLY_IQ2_XS,
    GGMLType.IQ2_S: F.MOSTLY_IQ2_S,
    GGMLType.IQ3_XXS: F.MOSTLY_IQ3_XXS,
    GGMLType.IQ1_S: F.MOSTLY_IQ1_S,
    GGMLType.IQ1_M: F.MOSTLY_IQ1_M,
    GGMLType.IQ4_NL: F.MOSTLY_IQ4_NL,
    GGMLType.IQ4_XS: F.MOSTLY_IQ4_XS,
    GGMLType.IQ3_S: F.MOSTLY_IQ3_S,
    GGMLType.NVFP4: F.MOSTLY_NVFP4,
    GGMLType.Q1_0: F.MOSTLY_Q1_0,
    GGMLType.Q2_0: F.MOSTLY_Q2_0,
}


def parse_ftype(text: str | int) -> QuantOption:
    """A file type by name (any case, aliases included) or number, as llama-quantize's ``try_parse_ftype``."""
    s = str(text).strip().upper()
    for opt in QUANT_OPTIONS:
        if opt.name == s:
            return opt
    try:
        n = int(s)
    except ValueError:
        n = None
    if n is not None:
        for opt in QUANT_OPTIONS:
            if opt.ftype == n:
                return opt
    names = ", ".join(o.name for o in QUANT_OPTIONS)
    raise QuantizeError(f"invalid file type {text!r} (known: {names}, or their numbers)")


def ftype_default_type(ftype: LlamaFType) -> GGMLType:
    """``llama_ftype_get_default_type``: the tensor type a file type starts every weight at."""
    try:
        return _DEFAULT_TYPE[LlamaFType(ftype)]
    except (KeyError, ValueError):
        raise QuantizeError(f"invalid output file type {int(ftype)}") from None


def guess_ftype(types: list[GGMLType]) -> int:
    """The loader's file type from tensor types in weight order (first type to reach the top count wins)."""
    counts: dict[GGMLType, int] = {}
    best, best_n = GGMLType.F32, 0
    for t in types:
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > best_n:
            best, best_n = t, counts[t]
    return int(_GUESS.get(best, F.ALL_F32)) | LLAMA_FTYPE_GUESSED


def parse_ggml_type(text: str) -> GGMLType:
    """A ggml type by its name in any case (``q8_0``, ``Q4_K``), as llama-quantize's ``parse_ggml_type``."""
    s = str(text).strip().lower()
    for t in GGMLType:
        try:
            name = t.type_name
        except Exception:  # ids without a type (removed types)
            continue
        if name and name.lower() == s:
            return t
    raise QuantizeError(f"invalid ggml_type {text!r}")
