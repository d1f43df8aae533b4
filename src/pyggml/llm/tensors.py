"""The names of a model's tensors in a GGUF file: one table, as llama.cpp's ``LLM_TENSOR_NAMES``
(llama-arch.cpp) and gguf-py's ``TENSOR_NAMES``.

An architecture module asks for ``LLMTensor.ATTN_Q`` of layer 3 and gets ``blk.3.attn_q.weight``;
no tensor name is spelled anywhere else.
"""

from __future__ import annotations

from enum import StrEnum


class LLMTensor(StrEnum):
    """llama.cpp's ``LLM_TENSOR_*``: the name format of each kind of tensor (``{bid}``: the layer)."""

    TOKEN_EMBD = "token_embd"
    TOKEN_EMBD_NORM = "token_embd_norm"
    TOKEN_TYPES = "token_types"
    POS_EMBD = "position_embd"
    OUTPUT_NORM = "output_norm"
    OUTPUT = "output"
    ROPE_FREQS = "rope_freqs"
    ROPE_FACTORS_LONG = "rope_factors_long"
    ROPE_FACTORS_SHORT = "rope_factors_short"
    CLS = "cls"
    CLS_OUT = "cls.output"
    DENSE_2_OUT = "dense_2"
    DENSE_3_OUT = "dense_3"
    ATTN_NORM = "blk.{bid}.attn_norm"
    ATTN_NORM_2 = "blk.{bid}.attn_norm_2"
    # LFM2's short convolution blocks
    SHORTCONV_CONV = "blk.{bid}.shortconv.conv"
    SHORTCONV_INPROJ = "blk.{bid}.shortconv.in_proj"
    SHORTCONV_OUTPROJ = "blk.{bid}.shortconv.out_proj"
    # RWKV's time mix (attention-like) and channel mix (FFN-like) blocks
    TIME_MIX_W0 = "blk.{bid}.time_mix_w0"
    TIME_MIX_W1 = "blk.{bid}.time_mix_w1"
    TIME_MIX_W2 = "blk.{bid}.time_mix_w2"
    TIME_MIX_A0 = "blk.{bid}.time_mix_a0"
    TIME_MIX_A1 = "blk.{bid}.time_mix_a1"
    TIME_MIX_A2 = "blk.{bid}.time_mix_a2"
    TIME_MIX_V0 = "blk.{bid}.time_mix_v0"
    TIME_MIX_V1 = "blk.{bid}.time_mix_v1"
    TIME_MIX_V2 = "blk.{bid}.time_mix_v2"
    TIME_MIX_G1 = "blk.{bid}.time_mix_g1"
    TIME_MIX_G2 = "blk.{bid}.time_mix_g2"
    TIME_MIX_LERP_X = "blk.{bid}.time_mix_lerp_x"
    TIME_MIX_LERP_W = "blk.{bid}.time_mix_lerp_w"
    TIME_MIX_LERP_K = "blk.{bid}.time_mix_lerp_k"
    TIME_MIX_LERP_V = "blk.{bid}.time_mix_lerp_v"
    TIME_MIX_LERP_R = "blk.{bid}.time_mix_lerp_r"
    TIME_MIX_LERP_G = "blk.{bid}.time_mix_lerp_g"
    TIME_MIX_LERP_FUSED = "blk.{bid}.time_mix_lerp_fused"
    TIME_MIX_FIRST = "blk.{bid}.time_mix_first"
    TIME_MIX_DECAY = "blk.{bid}.time_mix_decay"
    TIME_MIX_DECAY_W1 = "blk.{bid}.time_mix_decay_w1"
    TIME_MIX_DECAY_W2 = "blk.{bid}.time_mix_decay_w2"
    TIME_MIX_KEY = "blk.{bid}.time_mix_key"
    TIME_MIX_VALUE = "blk.{bid}.time_mix_value"
    TIME_MIX_RECEPTANCE = "blk.{bid}.time_mix_receptance"
    TIME_MIX_GATE = "blk.{bid}.time_mix_gate"
    TIME_MIX_LN = "blk.{bid}.time_mix_ln"
    TIME_MIX_OUTPUT = "blk.{bid}.time_mix_output"
    TIME_MIX_K_K = "blk.{bid}.time_mix_k_k"
    TIME_MIX_K_A = "blk.{bid}.time_mix_k_a"
    TIME_MIX_R_K = "blk.{bid}.time_mix_r_k"
    CHANNEL_MIX_LERP_K = "blk.{bid}.channel_mix_lerp_k"
    CHANNEL_MIX_LERP_R = "blk.{bid}.channel_mix_lerp_r"
    CHANNEL_MIX_KEY = "blk.{bid}.channel_mix_key"
    CHANNEL_MIX_VALUE = "blk.{bid}.channel_mix_value"
    CHANNEL_MIX_RECEPTANCE = "blk.{bid}.channel_mix_receptance"
    ATTN_QKV = "blk.{bid}.attn_qkv"
    ATTN_Q = "blk.{bid}.attn_q"
    ATTN_K = "blk.{bid}.attn_k"
    ATTN_V = "blk.{bid}.attn_v"
    ATTN_OUT = "blk.{bid}.attn_output"
    ATTN_Q_NORM = "blk.{bid}.attn_q_norm"
    ATTN_K_NORM = "blk.{bid}.attn_k_norm"
    ATTN_POST_NORM = "blk.{bid}.post_attention_norm"
    ATTN_SINKS = "blk.{bid}.attn_sinks"
    ATTN_OUT_NORM = "blk.{bid}.attn_output_norm"
    LAYER_OUT_NORM = "blk.{bid}.layer_output_norm"
    FFN_NORM = "blk.{bid}.ffn_norm"
    FFN_GATE = "blk.{bid}.ffn_gate"
    FFN_UP = "blk.{bid}.ffn_up"
    FFN_DOWN = "blk.{bid}.ffn_down"
    FFN_POST_NORM = "blk.{bid}.post_ffw_norm"
    FFN_GATE_INP = "blk.{bid}.ffn_gate_inp"
    FFN_GATE_EXPS = "blk.{bid}.ffn_gate_exps"
    FFN_UP_EXPS = "blk.{bid}.ffn_up_exps"
    FFN_DOWN_EXPS = "blk.{bid}.ffn_down_exps"
    FFN_GATE_SHEXP = "blk.{bid}.ffn_gate_shexp"
    FFN_UP_SHEXP = "blk.{bid}.ffn_up_shexp"
    FFN_DOWN_SHEXP = "blk.{bid}.ffn_down_shexp"
    SSM_IN = "blk.{bid}.ssm_in"
    SSM_CONV1D = "blk.{bid}.ssm_conv1d"
    SSM_X = "blk.{bid}.ssm_x"
    SSM_DT = "blk.{bid}.ssm_dt"
    SSM_DT_NORM = "blk.{bid}.ssm_dt_norm"
    SSM_A = "blk.{bid}.ssm_a"
    SSM_B_NORM = "blk.{bid}.ssm_b_norm"
    SSM_C_NORM = "blk.{bid}.ssm_c_norm"
    SSM_D = "blk.{bid}.ssm_d"
    SSM_NORM = "blk.{bid}.ssm_norm"
    SSM_OUT = "blk.{bid}.ssm_out"

    def name_of(self, suffix: str | None = "weight", bid: int | None = None) -> str:
        """llama.cpp's ``tn(tensor, suffix, bid)``: ``blk.3.attn_q.weight``."""
        if "{bid}" in self.value:
            if bid is None:
                raise ValueError(f"tensor {self.name} is per layer: give its layer")
            base = self.value.format(bid=bid)
        else:
            base = self.value
        return f"{base}.{suffix}" if suffix else base
