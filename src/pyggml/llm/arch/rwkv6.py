"""rwkv6 (src/models/rwkv6.cpp, rwkv6-base.cpp): RWKV-6 "Finch", a recurrent model with no attention.

The time mix interpolates each input with the previous token's through a data-dependent LoRA (five mixes,
for w, k, v, r, g), projects r, k, v and the gate (SiLU), makes the per-token decay w = exp(-exp(...)) with
a second LoRA, and runs the RWKV_WKV6 recurrence (u = time_mix_first, the bonus of the current token) over
the WKV state. The channel mix is sigmoid(receptance) * value(relu(key)^2). Files converted with
``rescale_every_n_layers`` have their output weights pre-divided and halve the stream every n layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..tensors import LLMTensor as T
from . import register
from .rwkv_common import RwkvBase, head_norm, wkv_split, wkv_state

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model

#: the five token-shift mixes, in the order of time_mix_w1's blocks and of time_mix_lerp_fused
MIXES = ("w", "k", "v", "r", "g")


@register
class Rwkv6(RwkvBase):
    name = "rwkv6"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_rwkv6_hparams(hp, kv)

    def load_tensors(self, m: Model) -> None:
        self.load_common(m)
        hp = m.hparams
        n, n_ff = hp.n_embd, hp.n_ff[0]
        for il, layer in enumerate(m.layers):
            load_time_mix6(m, layer, il)
            c = m.create_tensor
            layer.channel_mix_lerp_k = c(T.CHANNEL_MIX_LERP_K, (n, 1, 1), il)
            layer.channel_mix_lerp_r = c(T.CHANNEL_MIX_LERP_R, (n, 1, 1), il)
            layer.channel_mix_key = c(T.CHANNEL_MIX_KEY, (n, n_ff), il)
            layer.channel_mix_value = c(T.CHANNEL_MIX_VALUE, (n_ff, n), il)
            layer.channel_mix_receptance = c(T.CHANNEL_MIX_RECEPTANCE, (n, n), il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        return self.layers(g, rwkv6_time_mix, rwkv6_channel_mix, g.hp.rescale_every_n_layers)


def load_rwkv6_hparams(hp: HParams, kv: KV) -> None:
    hp.time_mix_extra_dim = int(kv.get(Keys.TIME_MIX_EXTRA_DIM))
    hp.time_decay_extra_dim = int(kv.get(Keys.TIME_DECAY_EXTRA_DIM))
    hp.rescale_every_n_layers = int(kv.get(Keys.RESCALE_EVERY_N_LAYERS, 0))


def load_time_mix6(m: Model, layer: Layer, il: int, qwen: bool = False) -> None:
    """The RWKV-6 time mix's tensors. ``qwen`` (rwkv6qwen2): time_mix_first optional (absent in QRWKV6, which
    then runs GATED_LINEAR_ATTN), K and V n_head_kv heads wide, optional r/k/v biases, no ln; else the older
    per-mix lerps may stand in for the fused one."""
    hp, c = m.hparams, m.create_tensor
    n, head = hp.n_embd, hp.wkv_head_size
    mix, decay = hp.time_mix_extra_dim, hp.time_decay_extra_dim
    n_kv = n if not hp.n_head_kv[il] or n // head == hp.n_head_kv[il] else hp.n_head_kv[il] * head
    layer.time_mix_w1 = c(T.TIME_MIX_W1, (n, mix * 5), il)
    layer.time_mix_w2 = c(T.TIME_MIX_W2, (mix, n, 5), il)
    layer.time_mix_lerp_x = c(T.TIME_MIX_LERP_X, (n, 1, 1), il)
    if not qwen:
        for name in MIXES:  # older files: one lerp per mix instead of the fused tensor
            setattr(layer, f"time_mix_lerp_{name}", c(T[f"TIME_MIX_LERP_{name.upper()}"], (n, 1, 1), il,
                                                     required=False))
    layer.time_mix_lerp_fused = c(T.TIME_MIX_LERP_FUSED, (n, 1, 1, 5), il, required=qwen)
    if layer.time_mix_lerp_fused is None and layer.time_mix_lerp_w is None:
        c(T.TIME_MIX_LERP_FUSED, (n, 1, 1, 5), il)  # names the missing tensor
    layer.time_mix_first = c(T.TIME_MIX_FIRST, (head, n // head), il, required=not qwen)
    layer.time_mix_decay = c(T.TIME_MIX_DECAY, (n,), il)
    layer.time_mix_decay_w1 = c(T.TIME_MIX_DECAY_W1, (n, decay), il)
    layer.time_mix_decay_w2 = c(T.TIME_MIX_DECAY_W2, (decay, n), il)
    layer.time_mix_key = c(T.TIME_MIX_KEY, (n, n_kv), il)
    layer.time_mix_value = c(T.TIME_MIX_VALUE, (n, n_kv), il)
    layer.time_mix_receptance = c(T.TIME_MIX_RECEPTANCE, (n, n), il)
    layer.time_mix_gate = c(T.TIME_MIX_GATE, (n, n), il)
    if qwen:
        layer.time_mix_key_b = c(T.TIME_MIX_KEY, (n_kv,), il, "bias", required=False)
        layer.time_mix_value_b = c(T.TIME_MIX_VALUE, (n_kv,), il, "bias", required=False)
        layer.time_mix_receptance_b = c(T.TIME_MIX_RECEPTANCE, (n,), il, "bias", required=False)
    else:
        layer.time_mix_ln = c(T.TIME_MIX_LN, (n,), il)
        layer.time_mix_ln_b = c(T.TIME_MIX_LN, (n,), il, "bias")
    layer.time_mix_output = c(T.TIME_MIX_OUTPUT, (n, n), il)


def rwkv6_channel_mix(g: GraphBuilder, layer: Layer, cur: Tensor, x_prev: Tensor) -> Tensor:
    """build_rwkv6_channel_mix: sigmoid(receptance(xr)) * value(relu(key(xk))^2), xk and xr lerps of the shift."""
    ctx = g.ctx
    sx = B.sub(ctx, x_prev, cur)
    xk = B.add(ctx, B.mul(ctx, sx, layer.channel_mix_lerp_k), cur)
    xr = B.add(ctx, B.mul(ctx, sx, layer.channel_mix_lerp_r), cur)
    r = B.sigmoid(ctx, g.mm(layer.channel_mix_receptance, xr))
    k = B.sqr(ctx, B.relu(ctx, g.mm(layer.channel_mix_key, xk)))
    return B.mul(ctx, r, g.mm(layer.channel_mix_value, k))


def rwkv6_time_mix(g: GraphBuilder, layer: Layer, cur: Tensor, x_prev: Tensor, il: int) -> Tensor:
    """build_rwkv6_time_mix. RWKV-6 proper (time_mix_first present): a SiLU gate, RWKV_WKV6, the per-head
    LayerNorm. QRWKV6 (no time_mix_first, rwkv6qwen2): a sigmoid gate, k scaled by 1 - w, GATED_LINEAR_ATTN
    with scale head_size^-0.5 and no norm; K and V repeated from n_head_kv heads when fewer."""
    ctx, hp = g.ctx, g.hp
    n_embd, n_tokens = hp.n_embd, g.n_tokens
    head_size = hp.wkv_head_size
    n_head = n_embd // head_size
    n_head_kv = hp.n_head_kv[il]
    qrwkv = layer.time_mix_first is None
    sx = B.reshape_2d(ctx, B.sub(ctx, x_prev, cur), n_embd, n_tokens)
    cur = B.reshape_2d(ctx, cur, n_embd, n_tokens)
    xxx = B.add(ctx, B.mul(ctx, sx, layer.time_mix_lerp_x), cur)
    w1, w2 = layer.time_mix_w1, layer.time_mix_w2
    xxx = B.reshape_4d(ctx, B.tanh(ctx, B.mul_mat(ctx, w1, xxx)), w1.ne[1] // 5, 1, 5, n_tokens)
    xxx = B.cont(ctx, B.permute(ctx, xxx, 0, 1, 3, 2))
    xxx = B.mul_mat(ctx, B.reshape_4d(ctx, w2, w2.ne[0], w2.ne[1], 1, 5), xxx)  # {n_embd, 1, n_tokens, 5}

    def part(i: int) -> Tensor:
        return B.view_2d(ctx, xxx, n_embd, n_tokens, xxx.nb[1], i * n_embd * n_tokens * xxx.nb[0])

    if layer.time_mix_lerp_fused is not None:
        sx3 = B.reshape_3d(ctx, sx, n_embd, 1, n_tokens)
        cur3 = B.reshape_3d(ctx, cur, n_embd, 1, n_tokens)
        xxx = B.add(ctx, B.mul(ctx, B.add(ctx, xxx, layer.time_mix_lerp_fused), sx3), cur3)
        xw, xk, xv, xr, xg = (part(i) for i in range(5))
    else:
        lerps = [getattr(layer, f"time_mix_lerp_{name}") for name in MIXES]
        xw, xk, xv, xr, xg = (B.add(ctx, B.mul(ctx, B.add(ctx, part(i), lerp), sx), cur)
                              for i, lerp in enumerate(lerps))
    r = g.mm(layer.time_mix_receptance, xr, layer.time_mix_receptance_b)
    k = g.mm(layer.time_mix_key, xk, layer.time_mix_key_b)
    v = g.mm(layer.time_mix_value, xv, layer.time_mix_value_b)
    gate = g.mm(layer.time_mix_gate, xg)
    gate = B.sigmoid(ctx, gate) if qrwkv else B.silu(ctx, gate)
    if n_head_kv and n_head_kv != n_head:
        k = B.repeat_4d(ctx, B.reshape_4d(ctx, k, head_size, 1, n_head_kv, n_tokens),
                        head_size, n_head // n_head_kv, n_head_kv, n_tokens)
        v = B.repeat_4d(ctx, B.reshape_4d(ctx, v, head_size, 1, n_head_kv, n_tokens),
                        head_size, n_head // n_head_kv, n_head_kv, n_tokens)
    k, v, r = (B.reshape_3d(ctx, t, head_size, n_head, n_tokens) for t in (k, v, r))
    w = B.mul_mat(ctx, layer.time_mix_decay_w2, B.tanh(ctx, B.mul_mat(ctx, layer.time_mix_decay_w1, xw)))
    w = B.exp(ctx, B.neg(ctx, B.exp(ctx, B.add(ctx, w, layer.time_mix_decay))))
    w = B.reshape_3d(ctx, w, head_size, n_head, n_tokens)
    if qrwkv:
        k = B.sub(ctx, k, B.mul(ctx, k, w))  # k * (1 - w)
        out = B.gated_linear_attn(ctx, k, v, r, w, wkv_state(g, il), float(head_size ** -0.5))
        cur = wkv_split(g, out, il)
    else:
        out = B.rwkv_wkv6(ctx, k, v, r, layer.time_mix_first, w, wkv_state(g, il))
        cur = head_norm(g, wkv_split(g, out, il), layer.time_mix_ln, layer.time_mix_ln_b, n_head)
    cur = g.mm(layer.time_mix_output, B.mul(ctx, cur, gate))
    return B.reshape_3d(ctx, cur, n_embd, g.n_seq_tokens, g.n_seqs)
