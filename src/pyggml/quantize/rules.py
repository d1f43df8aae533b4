"""Which type each tensor gets: llama.cpp's ``llama_tensor_get_type`` and its helpers (src/llama-quant.cpp).

The rules are stateful in the same way as llama.cpp's: counters of attn_v / ffn_* tensors seen so far
decide "first layers get more bits", so tensors must be visited in the loader's order (by layer, then
by name; see :func:`weight_order`). Everything here is pure: names, shapes, hparams in; types out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from ..types import GGMLType
from .errors import QuantizeError
from .ftypes import LlamaFType

F = LlamaFType
T = GGMLType


class Category(Enum):
    """``tensor_category``: broad roles, found by name fragments as llama.cpp does."""

    TOKEN_EMBD = 0
    ATTENTION_Q = 1
    ATTENTION_V = 2
    ATTENTION_K = 3
    ATTENTION_QKV = 4
    ATTENTION_KV_B = 5
    ATTENTION_OUTPUT = 6
    FFN_UP = 7
    FFN_GATE = 8
    FFN_DOWN = 9
    OUTPUT = 10
    OTHER = 11


_CATEGORY_FRAGMENTS = (
    ("attn_qkv.weight", Category.ATTENTION_QKV),
    ("attn_kv_b.weight", Category.ATTENTION_KV_B),
    ("attn_v.weight", Category.ATTENTION_V),
    ("attn_k.weight", Category.ATTENTION_K),
    ("attn_q.weight", Category.ATTENTION_Q),
    ("attn_output.weight", Category.ATTENTION_OUTPUT),
    ("ffn_up", Category.FFN_UP),
    ("ffn_gate", Category.FFN_GATE),
    ("ffn_down", Category.FFN_DOWN),
)


def is_token_embd(name: str) -> bool:
    return name in ("token_embd.weight", "per_layer_token_embd.weight")


def category_of(name: str) -> Category:
    """``tensor_get_category``."""
    if name == "output.weight":
        return Category.OUTPUT
    if is_token_embd(name):
        return Category.TOKEN_EMBD
    for frag, cat in _CATEGORY_FRAGMENTS:
        if frag in name:
            return cat
    return Category.OTHER


def _is_attn_v(cat: Category) -> bool:
    return cat in (Category.ATTENTION_V, Category.ATTENTION_QKV, Category.ATTENTION_KV_B)


_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> int:
    """The layer a ``blk.N.`` tensor belongs to, -1 for the others (``sscanf("blk.%d.")``)."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else -1


def weight_order(names: list[str]) -> list[str]:
    """The loader's ``weights_map`` order: by layer number (non-layer tensors first), then by name.

    Names compare as C strings (bytes), like ``std::string``'s ``<``.
    """
    return sorted(names, key=lambda n: (layer_of(n), n.encode()))


_NEVER = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_NEVER_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
)


@dataclass
class QuantParams:
    """``llama_model_quantize_params``, the fields that steer the type choice."""

    ftype: LlamaFType = F.MOSTLY_Q8_0
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    quantize_output_tensor: bool = True
    only_copy: bool = False
    pure: bool = False
    #: ``--tensor-type`` patterns (regex searched in the tensor name, first match wins) and types
    tensor_types: list[tuple[str, GGMLType]] = field(default_factory=list)


def allows_quantization(p: QuantParams, arch: str, name: str, n_dims: int) -> bool:
    """``tensor_allows_quantization``: only 2-d/3-d ``*weight`` tensors that are not on the never-list."""
    if p.only_copy or n_dims < 2 or not name.endswith("weight"):
        return False
    if not p.quantize_output_tensor and name == "output.weight":
        return False
    if any(f in name for f in _NEVER):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not (arch == "glm5-next" and any(f in name for f in _NEVER_GLM5_NEXT))


@dataclass
class ModelInfo:
    """The hparams the rules read: from the GGUF metadata, as the loader reads them."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0
    is_70b: bool = False

    @classmethod
    def from_hparams(cls, arch: str, n_layer: int, n_head: int, n_head_kv: int, n_expert: int = 0) -> ModelInfo:
        """As ``llama_quant_model_from_metadata``: a llama with 80 layers and GQA is the 70B type."""
        return cls(arch, n_layer, n_head, n_head_kv, n_expert,
                   is_70b=arch == "llama" and n_layer == 80 and n_head != n_head_kv)

    @property
    def n_gqa(self) -> int:
        return 0 if self.n_head_kv == 0 else self.n_head // self.n_head_kv


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # C++ integer division and modulo truncate toward zero
    d = n_layers // 8
    diff = i_layer - d
    mod = diff - int(diff / 3) * 3
    return i_layer < d or i_layer >= 7 * n_layers // 8 or mod == 2


_FALLBACK = {
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
    T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
    T.Q2_0: T.Q4_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}


class TypeChooser:
    """``quantize_state_impl`` + ``llama_tensor_get_type``: call :meth:`choose` in weight order."""

    def __init__(self, model: ModelInfo, params: QuantParams, names: list[str], has_imatrix: bool) -> None:
        self.m = model
        self.p = params
        self.has_imatrix = has_imatrix
        cats = [category_of(n) for n in names]
        self.n_attention_wv = sum(1 for c in cats if _is_attn_v(c))
        self.has_tied_embeddings = Category.OUTPUT not in cats
        self.n_ffn_down = self.n_ffn_gate = self.n_ffn_up = model.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0
        self.fallbacks: list[str] = []
        try:
            self.patterns = [(re.compile(pat), ty) for pat, ty in params.tensor_types]
        except re.error as e:
            raise QuantizeError(f"bad --tensor-type pattern: {e}") from None

    def _layer_info(self, i_layer: int, n_layer: int, name: str) -> tuple[int, int]:
        if max(1, self.m.n_expert) > 1:
            i = layer_of(name)
            if i < 0:
                raise QuantizeError(f"Failed to determine layer for tensor {name}")
            if i >= n_layer:
                raise QuantizeError(f"Bad layer {i} for tensor {name}. Must be in [0, {n_layer})")
            return i, n_layer
        return i_layer, n_layer

    def _matches(self, name: str) -> GGMLType | None:
        for pat, ty in self.patterns:
            if pat.search(name):
                return ty
        return None

    def choose(self, name: str, ne: tuple[int, ...], cur_type: GGMLType, n_dims: int, default: GGMLType) -> GGMLType:
        """``llama_tensor_get_type`` for one tensor (advances the layer counters as llama.cpp does)."""
        p = self.p
        if not allows_quantization(p, self.m.arch, name, n_dims):
            return cur_type
        cat = category_of(name)
        # per_layer_token_embd follows --token-embedding-type unless a --tensor-type names it
        if (p.token_embedding_type is not None and cat == Category.TOKEN_EMBD
                and not (name == "per_layer_token_embd.weight" and self._matches(name) is not None)):
            return p.token_embedding_type
        if p.output_tensor_type is not None and cat == Category.OUTPUT:
            return p.output_tensor_type
        new_type = default
        if not default.is_quantized:
            return new_type
        manual = False
        if self.patterns:
            ty = self._matches(name)
            if ty is not None:
                new_type, manual = ty, True
        if not manual and not p.pure:
            new_type = self._impl(new_type, name, ne, cat)
        return self._fallback(name, ne, new_type)

    def _fallback(self, name: str, ne: tuple[int, ...], target: GGMLType) -> GGMLType:
        """``tensor_type_fallback``: a type whose blocks fit the row, else F16."""
        ncols, qk = ne[0], target.blck_size
        if ncols % qk == 0:
            return target
        self.n_fallback += 1
        ret = _FALLBACK.get(target)
        if ret is None:
            if qk > 32:
                raise QuantizeError(f"no tensor type fallback is defined for type {target.type_name}")
            ret = target
        if ncols % ret.blck_size:
            ret = T.F16
        self.fallbacks.append(f"{name}: ncols {ncols} not divisible by {qk} ({target.type_name}) -> {ret.type_name}")
        return ret

    def _impl(self, new_type: GGMLType, name: str, ne: tuple[int, ...], cat: Category) -> GGMLType:
        """``llama_tensor_get_type_impl``: the per-file-type bumps, transcribed rule by rule."""
        ft, m = self.p.ftype, self.m
        glm_q = m.arch == "glm5-next" and any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj"))
        if glm_q and new_type not in (T.F32, T.BF16, T.F16):
            return T.Q8_0
        iq_low = (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M,
                  F.MOSTLY_IQ1_M)
        if cat == Category.OUTPUT or (self.has_tied_embeddings and cat == Category.TOKEN_EMBD):
            if self.p.output_tensor_type is not None:
                return self.p.output_tensor_type
            nx = ne[0]
            if ft == F.MOSTLY_MXFP4_MOE or m.arch == "falcon" or nx % new_type.blck_size:
                return T.Q8_0
            if ft in (*iq_low, F.MOSTLY_IQ3_XXS):
                return T.Q5_K
            return new_type if new_type == T.Q8_0 else T.Q6_K
        if ft == F.MOSTLY_MXFP4_MOE:
            is_bm3_expert = m.arch == "bailingmoe3" and cat in (Category.FFN_UP, Category.FFN_GATE,
                                                                   Category.FFN_DOWN)
            ne2 = ne[2] if len(ne) > 2 else 1
            return T.MXFP4 if ne2 > 1 and (m.arch != "bailingmoe3" or is_bm3_expert) else T.Q8_0
        if cat == Category.TOKEN_EMBD:
            if self.p.token_embedding_type is not None:
                return self.p.token_embedding_type
            if ft in (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M):
                return T.Q2_K
            if ft in (F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M, F.MOSTLY_IQ3_XXS):
                return T.IQ3_S
            if ft in (F.MOSTLY_TQ1_0, F.MOSTLY_TQ2_0, F.MOSTLY_Q2_0):
                return T.Q4_K
            return new_type
        iq2sm = ft in (F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M)
        if ft in iq_low:
            if _is_attn_v(cat):
                if m.n_gqa >= 4 or m.n_expert >= 4:
                    new_type = T.Q4_K
                else:
                    new_type = T.IQ3_S if iq2sm else T.Q2_K
                self.i_attention_wv += 1
            elif m.n_expert == 8 and cat == Category.ATTENTION_K:
                new_type = T.Q4_K
            elif cat == Category.FFN_DOWN:
                if self.i_ffn_down < self.n_ffn_down // 8:
                    new_type = T.IQ3_S if iq2sm else T.Q2_K
                self.i_ffn_down += 1
            elif cat == Category.ATTENTION_OUTPUT:
                if m.n_expert == 8:
                    new_type = T.Q5_K
                elif ft in (F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M):
                    new_type = T.IQ2_XXS
                elif iq2sm:
                    new_type = T.IQ3_S
            return new_type
        if _is_attn_v(cat):
            return self._attn_v(new_type)
        if cat in (Category.ATTENTION_K, Category.ATTENTION_Q):
            if cat == Category.ATTENTION_K and m.n_expert == 8:
                return T.Q8_0
            # llama.cpp's attn_k and attn_q branches demote IQ3_XS / IQ3_XXS alike
            return {F.MOSTLY_IQ3_XS: T.IQ3_XXS, F.MOSTLY_IQ3_XXS: T.IQ2_S}.get(ft, new_type)
        if cat == Category.FFN_DOWN:
            return self._ffn_down(new_type, name)
        if cat == Category.ATTENTION_OUTPUT:
            if m.arch != "falcon":
                if m.n_expert == 8:
                    if ft in (F.MOSTLY_Q2_K, F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_XXS, F.MOSTLY_Q3_K_S, F.MOSTLY_Q3_K_M,
                              F.MOSTLY_IQ4_NL, F.MOSTLY_Q4_K_S, F.MOSTLY_Q4_K_M, F.MOSTLY_IQ3_S, F.MOSTLY_IQ3_M,
                              F.MOSTLY_IQ4_XS):
                        new_type = T.Q5_K
                else:
                    new_type = {F.MOSTLY_Q2_K: T.Q3_K, F.MOSTLY_IQ3_XXS: T.IQ3_S, F.MOSTLY_Q3_K_M: T.Q4_K,
                                F.MOSTLY_Q3_K_L: T.Q5_K, F.MOSTLY_IQ3_M: T.Q4_K}.get(ft, new_type)
            elif ft == F.MOSTLY_Q3_K_L:
                new_type = T.Q4_K
            return new_type
        if cat == Category.ATTENTION_QKV:
            if ft in (F.MOSTLY_Q3_K_M, F.MOSTLY_Q3_K_L, F.MOSTLY_IQ3_M):
                return T.Q4_K
            return {F.MOSTLY_Q4_K_M: T.Q5_K, F.MOSTLY_Q5_K_M: T.Q6_K}.get(ft, new_type)
        if cat in (Category.FFN_GATE, Category.FFN_UP):
            gate = cat == Category.FFN_GATE
            i_layer, n_layer = self._layer_info(self.i_ffn_gate if gate else self.i_ffn_up,
                                                self.n_ffn_gate if gate else self.n_ffn_up, name)
            if ft == F.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
                new_type = T.IQ3_XXS
            if gate:
                self.i_ffn_gate += 1
            else:
                self.i_ffn_up += 1
        return new_type

    def _attn_v(self, new_type: GGMLType) -> GGMLType:
        ft, m = self.p.ftype, self.m
        gqa4 = m.n_gqa >= 4
        if ft == F.MOSTLY_Q2_K:
            new_type = T.Q4_K if gqa4 else T.Q3_K
        elif ft == F.MOSTLY_Q2_K_S and gqa4:
            new_type = T.Q4_K
        elif ft == F.MOSTLY_IQ3_XXS:
            new_type = T.Q4_K if gqa4 else (T.IQ3_S if not self.has_imatrix else T.IQ3_XXS)
        elif (ft in (F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_S) and gqa4) or ft == F.MOSTLY_IQ3_M:
            new_type = T.Q4_K
        elif ft == F.MOSTLY_Q3_K_M:
            new_type = T.Q5_K if self.i_attention_wv < 2 else T.Q4_K
        elif ft == F.MOSTLY_Q3_K_L or (ft in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS) and gqa4):
            new_type = T.Q5_K
        elif ft in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and _use_more_bits(self.i_attention_wv, self.n_attention_wv):
            new_type = T.Q6_K
        elif ft == F.MOSTLY_Q4_K_S and self.i_attention_wv < 4:
            new_type = T.Q5_K
        if m.is_70b and new_type in (T.Q3_K, T.Q4_K):
            new_type = T.Q5_K
        if m.n_expert == 8:
            new_type = T.Q8_0
        self.i_attention_wv += 1
        return new_type

    def _ffn_down(self, new_type: GGMLType, name: str) -> GGMLType:
        ft, m = self.p.ftype, self.m
        i_layer, n_layer = self._layer_info(self.i_ffn_down, self.n_ffn_down, name)
        falcon = m.arch == "falcon"
        if ft == F.MOSTLY_Q2_K:
            new_type = T.Q3_K
        elif ft == F.MOSTLY_Q2_K_S:
            if i_layer < n_layer // 8:
                new_type = T.Q4_K
        elif ft == F.MOSTLY_IQ3_XXS and not self.has_imatrix:
            new_type = T.Q4_K if i_layer < n_layer // 8 else T.Q3_K
        elif ft == F.MOSTLY_Q3_K_M:
            if i_layer < n_layer // 16:
                new_type = T.Q5_K
            elif not falcon or _use_more_bits(i_layer, n_layer):
                new_type = T.Q4_K
            else:
                new_type = T.Q3_K
        elif ft == F.MOSTLY_IQ3_M and (i_layer < n_layer // 8
                                       or (m.n_expert == 8 and _use_more_bits(i_layer, n_layer))):
            new_type = T.Q4_K
        elif ft == F.MOSTLY_Q3_K_L:
            new_type = T.Q4_K if falcon else T.Q5_K
        elif ft == F.MOSTLY_Q4_K_M:
            if falcon:
                new_type = (T.Q6_K if i_layer < n_layer // 16 else
                            T.Q5_K if _use_more_bits(i_layer, n_layer) else T.Q4_K)
            elif _use_more_bits(i_layer, n_layer):
                new_type = T.Q6_K
        elif i_layer < n_layer // 8 and ft in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS) and not self.has_imatrix:
            new_type = T.Q5_K
        elif ft == F.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
            new_type = T.Q6_K
        elif ft == F.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
            new_type = T.Q5_K
        elif ft in (F.MOSTLY_Q4_0, F.MOSTLY_Q5_0) and self.has_imatrix and i_layer < n_layer // 8:
            new_type = T.Q4_1 if ft == F.MOSTLY_Q4_0 else T.Q5_1
        self.i_ffn_down += 1
        return new_type


def requires_imatrix(name: str, dst: GGMLType, ftype: LlamaFType) -> bool:
    """``tensor_requires_imatrix``: the very-low-bit types (and Q2_K inside a Q2_K_S file)."""
    if is_token_embd(name) or name == "output.weight":
        return False
    if dst in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return dst == T.Q2_K and ftype == F.MOSTLY_Q2_K_S
