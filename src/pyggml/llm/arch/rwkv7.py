"""rwkv7 (src/models/rwkv7.cpp, rwkv7-base.cpp): RWKV-7 "Goose", a recurrent model with no attention.

Each layer's time mix mixes every input with the previous token's (six learned mixes, one fused tensor),
projects r, k, v and, through small LoRAs, the decay w, the in-context learning rate a, the gate g and
(after layer 0) the mix toward layer 0's values; then runs the RWKV_WKV7 recurrence over the WKV state
with a = -kk and b = kk * a, kk the L2-normalized keys per head. The channel mix is relu(k)^2 -> value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..hparams import ModelLoadError
from ..tensors import LLMTensor as T
from . import register
from .rwkv_common import RwkvBase, head_norm, wkv_split, wkv_state

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model

#: w = exp(-0.606531 * sigmoid(...)): the decay's range, exp(-e^-0.5) to 1
DECAY_SCALE = -0.606531
L2_NORM_EPS = 1e-12


@register
class Rwkv7(RwkvBase):
    name = "rwkv7"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_rwkv7_hparams(hp, kv)

    def load_tensors(self, m: Model) -> None:
        self.load_common(m)
        hp = m.hparams
        n, n_ff = hp.n_embd, hp.n_ff[0]
        for il, layer in enumerate(m.layers):
            load_time_mix7(m, layer, il)
            layer.channel_mix_lerp_k = m.create_tensor(T.CHANNEL_MIX_LERP_K, (n, 1, 1), il)
            layer.channel_mix_key = m.create_tensor(T.CHANNEL_MIX_KEY, (n, n_ff), il)
            layer.channel_mix_value = m.create_tensor(T.CHANNEL_MIX_VALUE, (n_ff, n), il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        return self.layers(g, rwkv7_time_mixer(), rwkv7_channel_mix)


def rwkv7_time_mixer() -> Callable[[GraphBuilder, Layer, Tensor, Tensor, int], Tensor]:
    """The time mix of one graph's layers, which share layer 0's values (the value residual)."""
    v_first: list[Tensor] = []

    def time_mix(g: GraphBuilder, layer: Layer, cur: Tensor, x_prev: Tensor, il: int) -> Tensor:
        return rwkv7_time_mix(g, layer, cur, x_prev, v_first, il)

    return time_mix


def load_rwkv7_hparams(hp: HParams, kv: KV) -> None:
    hp.n_lora_decay = int(kv.get(Keys.ATTENTION_DECAY_LORA_RANK))
    hp.n_lora_iclr = int(kv.get(Keys.ATTENTION_ICLR_LORA_RANK))
    hp.n_lora_value_res_mix = int(kv.get(Keys.ATTENTION_VALUE_RESIDUAL_MIX_LORA_RANK))
    hp.n_lora_gate = int(kv.get(Keys.ATTENTION_GATE_LORA_RANK, 0))


def load_time_mix7(m: Model, layer: Layer, il: int, optional: bool = False) -> None:
    """The RWKV-7 time mix's tensors; ``optional``: the gate (then 5 token-shift mixes, not 6) and the per-head
    ln may be absent (arwkv7)."""
    hp, c = m.hparams, m.create_tensor
    n = hp.n_embd
    layer.time_mix_w0 = c(T.TIME_MIX_W0, (n,), il)
    layer.time_mix_w1 = c(T.TIME_MIX_W1, (n, hp.n_lora_decay), il)
    layer.time_mix_w2 = c(T.TIME_MIX_W2, (hp.n_lora_decay, n), il)
    layer.time_mix_a0 = c(T.TIME_MIX_A0, (n,), il)
    layer.time_mix_a1 = c(T.TIME_MIX_A1, (n, hp.n_lora_iclr), il)
    layer.time_mix_a2 = c(T.TIME_MIX_A2, (hp.n_lora_iclr, n), il)
    rank_v = hp.n_lora_iclr if il == 0 else hp.n_lora_value_res_mix  # layer 0's are loaded, unused
    layer.time_mix_v0 = c(T.TIME_MIX_V0, (n,), il)
    layer.time_mix_v1 = c(T.TIME_MIX_V1, (n, rank_v), il)
    layer.time_mix_v2 = c(T.TIME_MIX_V2, (rank_v, n), il)
    layer.time_mix_g1 = c(T.TIME_MIX_G1, (n, hp.n_lora_gate), il, required=not optional)
    layer.time_mix_g2 = c(T.TIME_MIX_G2, (hp.n_lora_gate, n), il, required=not optional)
    try:
        layer.time_mix_lerp_fused = c(T.TIME_MIX_LERP_FUSED, (n, 1, 1, 6), il)
    except ModelLoadError:
        if not optional:
            raise
        layer.time_mix_lerp_fused = c(T.TIME_MIX_LERP_FUSED, (n, 1, 1, 5), il)  # no gate
    layer.time_mix_k_k = c(T.TIME_MIX_K_K, (n,), il)
    layer.time_mix_k_a = c(T.TIME_MIX_K_A, (n,), il)
    layer.time_mix_r_k = c(T.TIME_MIX_R_K, (n,), il)
    layer.time_mix_key = c(T.TIME_MIX_KEY, (n, n), il)
    layer.time_mix_value = c(T.TIME_MIX_VALUE, (n, n), il)
    layer.time_mix_receptance = c(T.TIME_MIX_RECEPTANCE, (n, n), il)
    layer.time_mix_ln = c(T.TIME_MIX_LN, (n,), il, required=not optional)
    layer.time_mix_ln_b = c(T.TIME_MIX_LN, (n,), il, "bias", required=not optional)
    layer.time_mix_output = c(T.TIME_MIX_OUTPUT, (n, n), il)


def rwkv7_channel_mix(g: GraphBuilder, layer: Layer, cur: Tensor, x_prev: Tensor) -> Tensor:
    """build_rwkv7_channel_mix: value(relu(key(lerp(cur, x_prev)))^2)."""
    ctx = g.ctx
    xk = B.add(ctx, B.mul(ctx, B.sub(ctx, x_prev, cur), layer.channel_mix_lerp_k), cur)
    return g.mm(layer.channel_mix_value, B.sqr(ctx, B.relu(ctx, g.mm(layer.channel_mix_key, xk))))


def rwkv7_time_mix(g: GraphBuilder, layer: Layer, cur: Tensor, x_prev: Tensor, v_first: list[Tensor],
                   il: int) -> Tensor:
    """build_rwkv7_time_mix: ``cur`` and ``x_prev`` {n_embd, n_seq_tokens, n_seqs}; ``v_first`` holds layer 0's
    values once layer 0 has run. Returns {n_embd, n_seq_tokens, n_seqs}."""
    ctx, hp = g.ctx, g.hp
    n_embd, n_tokens = hp.n_embd, g.n_tokens
    head_size = hp.wkv_head_size
    n_head = n_embd // head_size
    gating = layer.time_mix_g1 is not None and layer.time_mix_g2 is not None
    n_mix = 6 if gating else 5
    sx = B.repeat_4d(ctx, B.sub(ctx, x_prev, cur), n_embd, g.n_seq_tokens, g.n_seqs, n_mix)
    xxx = B.add(ctx, B.mul(ctx, sx, layer.time_mix_lerp_fused), cur)
    xr, xw, xk, xv, xa, *xg = (B.view_2d(ctx, xxx, n_embd, n_tokens, xxx.nb[1], i * n_embd * n_tokens * xxx.nb[0])
                               for i in range(n_mix))

    def lora(x: Tensor, down: Tensor, up: Tensor) -> Tensor:
        return B.mul_mat(ctx, up, B.mul_mat(ctx, down, x))

    r = g.mm(layer.time_mix_receptance, xr)
    w = B.add(ctx, B.mul_mat(ctx, layer.time_mix_w2, B.tanh(ctx, B.mul_mat(ctx, layer.time_mix_w1, xw))),
              layer.time_mix_w0)
    w = B.exp(ctx, B.scale(ctx, B.sigmoid(ctx, w), DECAY_SCALE))
    k = g.mm(layer.time_mix_key, xk)
    v = g.mm(layer.time_mix_value, xv)
    if not v_first:
        v_first.append(v)
    else:  # the value residual: v += (v_first - v) * sigmoid(v0 + LoRA(xv))
        mix = B.sigmoid(ctx, B.add(ctx, lora(xv, layer.time_mix_v1, layer.time_mix_v2), layer.time_mix_v0))
        v = B.add(ctx, v, B.mul(ctx, B.sub(ctx, v_first[0], v), mix))
    gate = None
    if gating:
        gate = B.mul_mat(ctx, layer.time_mix_g2, B.sigmoid(ctx, B.mul_mat(ctx, layer.time_mix_g1, xg[0])))
    a = B.sigmoid(ctx, B.add(ctx, lora(xa, layer.time_mix_a1, layer.time_mix_a2), layer.time_mix_a0))
    kk = B.reshape_3d(ctx, B.mul(ctx, k, layer.time_mix_k_k), head_size, n_head, n_tokens)
    kk = B.l2_norm(ctx, kk, L2_NORM_EPS)
    ka = B.mul(ctx, k, layer.time_mix_k_a)
    k = B.add(ctx, k, B.sub(ctx, B.mul(ctx, a, ka), ka))
    r, w, k, v, a = (B.reshape_3d(ctx, t, head_size, n_head, n_tokens) for t in (r, w, k, v, a))
    out = B.rwkv_wkv7(ctx, r, w, k, v, B.neg(ctx, kk), B.mul(ctx, kk, a), wkv_state(g, il))
    cur = wkv_split(g, out, il)
    if layer.time_mix_ln is not None and layer.time_mix_ln_b is not None:
        cur = head_norm(g, cur, layer.time_mix_ln, layer.time_mix_ln_b, n_head)
    rk = B.sum_rows(ctx, B.mul(ctx, B.mul(ctx, k, r), B.reshape_2d(ctx, layer.time_mix_r_k, head_size, n_head)))
    cur = B.add(ctx, cur, B.reshape_2d(ctx, B.mul(ctx, v, rk), n_embd, n_tokens))
    if gate is not None:
        cur = B.mul(ctx, cur, gate)
    cur = g.mm(layer.time_mix_output, cur)
    return B.reshape_3d(ctx, cur, n_embd, g.n_seq_tokens, g.n_seqs)


__all__ = ["Rwkv7", "load_rwkv7_hparams", "load_time_mix7", "rwkv7_channel_mix", "rwkv7_time_mix", "rwkv7_time_mixer"]
