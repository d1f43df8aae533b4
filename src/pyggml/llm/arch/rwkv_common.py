"""What RWKV-6 and RWKV-7 share (llama.cpp's build_rwkv_token_shift_load/_store in llama-graph.cpp and the
layer loop of src/models/rwkv6.cpp and rwkv7.cpp): the token shift kept in the recurrent memory, the
pre-norm block around the time mix and the channel mix, the WKV state's gather and store.

RWKV keeps no KV cache. Per layer and sequence the recurrent memory holds an ``r`` row of
``token_shift_count * n_embd`` floats (the last normed input of the time mix, then of the channel mix: what
the next token "shifts" in) and an ``s`` row of ``n_embd * head_size`` (the WKV state, one head_size^2
matrix per head). A ubatch is ``n_seqs`` runs of ``n_seq_tokens`` tokens (split_equal), so each token's
previous input is its neighbour in the run, or the stored shift for the first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, NormType
from ..hparams import LLAMA_ROPE_TYPE_NONE
from ..tensors import LLMTensor as T
from .base import Arch, load_ffn, require

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model

#: the LayerNorm eps of the per-head norm after the WKV (llama.cpp's "group norm with head_count groups")
WKV_NORM_EPS = 64e-5


class RwkvBase(Arch):
    """An RWKV model: recurrent in every layer, no RoPE, LayerNorms with biases."""

    rope_type = LLAMA_ROPE_TYPE_NONE
    recurrent = True

    #: the token-shift states a layer keeps: 2 (time mix and channel mix), 1 for the variants whose FFN is
    #: Qwen2's (rwkv6qwen2, arwkv7: only the time mix shifts)
    token_shifts: ClassVar[int] = 2

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.f_norm_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_EPS, 0.0))
        hp.f_norm_rms_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_RMS_EPS, 0.0))
        hp.wkv_head_size = int(kv.get(Keys.WKV_HEAD_SIZE))
        hp.token_shift_count = int(kv.get(Keys.TOKEN_SHIFT_COUNT, 2))
        require(hp.wkv_head_size > 0 and hp.n_embd % hp.wkv_head_size == 0,
                f"{hp.arch}: n_embd {hp.n_embd} is not a multiple of wkv.head_size {hp.wkv_head_size}")
        require(hp.token_shift_count == self.token_shifts,
                f"{hp.arch}: token_shift_count must be {self.token_shifts}, got {hp.token_shift_count}")
        hp.recurrent_layers = [True] * hp.n_layer

    def load_common(self, m: Model) -> None:
        """The embedding with LN0 (token_embd_norm), the head with its biased norm, each layer's two norms."""
        hp = m.hparams
        n = hp.n_embd
        m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (n, hp.n_vocab))
        m.tok_norm = m.create_tensor(T.TOKEN_EMBD_NORM, (n,))
        m.tok_norm_b = m.create_tensor(T.TOKEN_EMBD_NORM, (n,), suffix="bias")
        m.output_norm = m.create_tensor(T.OUTPUT_NORM, (n,))
        m.output_norm_b = m.create_tensor(T.OUTPUT_NORM, (n,), suffix="bias")
        m.output = m.create_tensor(T.OUTPUT, (n, hp.n_vocab))
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (n,), il)
            layer.attn_norm_b = m.create_tensor(T.ATTN_NORM, (n,), il, "bias")
            layer.attn_norm_2 = m.create_tensor(T.ATTN_NORM_2, (n,), il)
            layer.attn_norm_2_b = m.create_tensor(T.ATTN_NORM_2, (n,), il, "bias")

    def layers(self, g: GraphBuilder,
               time_mix: Callable[[GraphBuilder, Layer, Tensor, Tensor, int], Tensor],
               channel_mix: Callable[[GraphBuilder, Layer, Tensor, Tensor], Tensor],
               rescale_every: int = 0) -> Tensor:
        """The graph: LN0, then per layer the time mix and the channel mix, each on a LayerNorm of the stream
        with its token shift, residual adds around both (the stream halved every ``rescale_every`` layers,
        RWKV-6's fp16 guard); the output head. Returns the logits."""
        m, hp, ctx = g.model, g.hp, g.ctx
        n_embd, n_seq_tokens, n_seqs, n_tokens = hp.n_embd, g.n_seq_tokens, g.n_seqs, g.n_tokens
        inp = g.norm(g.inp_embd(), m.tok_norm, "inp_norm", -1, m.tok_norm_b, NormType.NORM)
        for il, layer in enumerate(m.layers):
            inp = B.reshape_3d(ctx, inp, n_embd, n_seq_tokens, n_seqs)
            shift = token_shift_load(g, il)
            att_shift = B.view_3d(ctx, shift, n_embd, 1, n_seqs, shift.nb[1], shift.nb[2], 0)
            ffn_shift = B.view_3d(ctx, shift, n_embd, 1, n_seqs, shift.nb[1], shift.nb[2], n_embd * shift.nb[0])
            att_norm = g.norm(inp, layer.attn_norm, "attn_norm", il, layer.attn_norm_b, NormType.NORM)
            cur = time_mix(g, layer, att_norm, _shifted(g, att_shift, att_norm), il)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            ffn_norm = g.norm(ffn_inp, layer.attn_norm_2, "ffn_norm", il, layer.attn_norm_2_b, NormType.NORM)
            x_prev = _shifted(g, ffn_shift, ffn_norm)
            shift = B.concat(ctx, _last_token(g, att_norm), _last_token(g, ffn_norm), 1)
            token_shift_store(g, shift, il)
            ffn_inp, ffn_norm, x_prev = (B.reshape_2d(ctx, t, n_embd, n_tokens) for t in (ffn_inp, ffn_norm, x_prev))
            ffn_inp, ffn_norm, x_prev = g.last_layer_rows(il, ffn_inp, ffn_norm, x_prev)
            cur = B.add(ctx, channel_mix(g, layer, ffn_norm, x_prev), ffn_inp)
            if rescale_every and (il + 1) % rescale_every == 0:
                cur = B.scale(ctx, cur, 0.5)
            inp = g.cb(cur, "l_out", il)
        return g.finish(inp, NormType.NORM)


class RwkvQwenBase(RwkvBase):
    """rwkv6qwen2 / arwkv7: an RWKV time mix in a Qwen2 block (RMSNorms, SwiGLU FFN), no LN0, one token shift."""

    token_shifts = 1

    def load_common(self, m: Model) -> None:
        hp = m.hparams
        n = hp.n_embd
        m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (n, hp.n_vocab))
        m.output_norm = m.create_tensor(T.OUTPUT_NORM, (n,))
        m.output_norm_b = m.create_tensor(T.OUTPUT_NORM, (n,), suffix="bias", required=False)
        m.output = m.create_tensor(T.OUTPUT, (n, hp.n_vocab))
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (n,), il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (n,), il)
            load_ffn(m, layer, il)

    def qwen_layers(self, g: GraphBuilder, time_mix: Callable[[GraphBuilder, Layer, Tensor, Tensor, int], Tensor]
                    ) -> Tensor:
        """The graph (src/models/rwkv6qwen2.cpp, arwkv7.cpp): per layer an RMSNorm, the time mix on it with
        its token shift, the residual add, then Qwen2's FFN block."""
        m, hp, ctx = g.model, g.hp, g.ctx
        n_embd, n_seq_tokens, n_seqs, n_tokens = hp.n_embd, g.n_seq_tokens, g.n_seqs, g.n_tokens
        inp = g.inp_embd()
        for il, layer in enumerate(m.layers):
            inp = B.reshape_3d(ctx, inp, n_embd, n_seq_tokens, n_seqs)
            shift = token_shift_load(g, il)
            att_norm = g.norm(inp, layer.attn_norm, "attn_norm", il, layer.attn_norm_b)
            cur = time_mix(g, layer, att_norm, _shifted(g, shift, att_norm), il)
            # the last token of each run, made contiguous: llama.cpp views it 1-d as it is, which with several
            # sequences of several tokens in a ubatch would store a neighbour's rows
            token_shift_store(g, B.cont(ctx, _last_token(g, att_norm)), il)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            (ffn_inp,) = g.last_layer_rows(il, B.reshape_2d(ctx, ffn_inp, n_embd, n_tokens))
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il)
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.SILU, il), "ffn_out", il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return g.finish(inp, NormType.RMS)


def _shifted(g: GraphBuilder, shift: Tensor, normed: Tensor) -> Tensor:
    """x_prev: each token's previous normed input, {n_embd, n_seq_tokens, n_seqs}: the stored shift, then the
    run's own tokens but the last."""
    n_embd, n_seq_tokens, n_seqs = g.hp.n_embd, g.n_seq_tokens, g.n_seqs
    head = B.view_3d(g.ctx, normed, n_embd, n_seq_tokens - 1, n_seqs, normed.nb[1], normed.nb[2], 0)
    return B.concat(g.ctx, shift, head, 1)


def _last_token(g: GraphBuilder, normed: Tensor) -> Tensor:
    """The last token of each run, {n_embd, 1, n_seqs}: what the next ubatch shifts in."""
    n_embd, n_seq_tokens, n_seqs = g.hp.n_embd, g.n_seq_tokens, g.n_seqs
    return B.view_3d(g.ctx, normed, n_embd, 1, n_seqs, normed.nb[1], normed.nb[2],
                     (n_seq_tokens - 1) * n_embd * normed.nb[0])


def token_shift_load(g: GraphBuilder, il: int) -> Tensor:
    """build_rwkv_token_shift_load: the ubatch's sequences' shift rows, {n_embd, token_shift_count, n_seqs}."""
    hp = g.hp
    rows = g.build_rs(g.rs_r(il), hp.n_embd_r(), g.n_seqs)
    return B.reshape_3d(g.ctx, rows, hp.n_embd, hp.token_shift_count, g.n_seqs)


def token_shift_store(g: GraphBuilder, shift: Tensor, il: int) -> None:
    """build_rwkv_token_shift_store: the new shifts stored in the ubatch's cells of layer il's r."""
    _store_rows(g, shift, g.rs_r(il), g.hp.n_embd_r())


def wkv_state(g: GraphBuilder, il: int) -> Tensor:
    """The WKV states the ubatch's sequences start from, {n_embd * head_size, n_seqs}."""
    return g.build_rs(g.rs_s(il), g.hp.n_embd_s(), g.n_seqs)


def wkv_split(g: GraphBuilder, out: Tensor, il: int) -> Tensor:
    """A WKV op's output is the tokens' values then the final states: the states are stored in layer il's s
    rows (added to the graph), the values returned as {n_embd, n_tokens}."""
    hp, ctx = g.hp, g.ctx
    n = hp.n_embd * g.n_tokens
    states = B.view_1d(ctx, out, hp.n_embd * hp.wkv_head_size * g.n_seqs, n * out.nb[0])
    _store_rows(g, states, g.rs_s(il), hp.n_embd_s())
    return B.reshape_2d(ctx, B.view_1d(ctx, out, n, 0), hp.n_embd, g.n_tokens)


def _store_rows(g: GraphBuilder, src: Tensor, dst: Tensor, width: int) -> None:
    """The first ``width`` values per sequence of ``src`` over the ubatch's rows of ``dst`` (GraphBuilder.store_rs)."""
    n = width * g.n_seqs
    g.store_rs(B.view_1d(g.ctx, src, n, 0), dst)


def head_norm(g: GraphBuilder, cur: Tensor, w: Tensor, b: Tensor, n_head: int) -> Tensor:
    """The LayerNorm of each head's WKV output (eps 64e-5), then the time mix's ln weight and bias."""
    ctx, n_embd = g.ctx, g.hp.n_embd
    cur = B.norm(ctx, B.reshape_3d(ctx, cur, n_embd // n_head, n_head, g.n_tokens), WKV_NORM_EPS)
    return B.add(ctx, B.mul(ctx, B.reshape_2d(ctx, cur, n_embd, g.n_tokens), w), b)
