"""The Mamba layers (src/models/mamba-base.cpp, llm_build_mamba_base) that mamba, mamba2 and the hybrids
(jamba, granitehybrid, falcon-h1) share, with their hparams and tensors.

A Mamba layer keeps two states per sequence in the recurrent memory (llm/memory_recurrent.py): the
last d_conv - 1 columns of its causal conv input (r) and its SSM state (s). Both are read through
``build_rs`` and stored with ``store_rs`` (the cells' new rows) once the layer has run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..tensors import LLMTensor as T
from .base import require

if TYPE_CHECKING:
    from ...context import Context
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model


def load_ssm_hparams(hp: HParams, kv: KV, group: bool) -> None:
    """The ssm.* keys: conv kernel, inner size, state size, time-step rank, (Mamba-2) group count, and the
    optional dt/B/C RMSNorm flag."""
    hp.ssm_d_conv = int(kv.get(Keys.SSM_CONV_KERNEL))
    hp.ssm_d_inner = int(kv.get(Keys.SSM_INNER_SIZE))
    hp.ssm_d_state = int(kv.get(Keys.SSM_STATE_SIZE))
    hp.ssm_dt_rank = int(kv.get(Keys.SSM_TIME_STEP_RANK))
    if group:
        hp.ssm_n_group = int(kv.get(Keys.SSM_GROUP_COUNT))
    hp.ssm_dt_b_c_rms = bool(kv.get(Keys.SSM_DT_B_C_RMS, False))


def require_expansion_2(hp: HParams) -> None:
    """Refuse an inner size other than twice the embedding: llama.cpp's Mamba graphs assume it."""
    require(2 * hp.n_embd == hp.ssm_d_inner, f"{hp.arch}: only an expansion factor of 2 is supported "
            f"(ssm.inner_size {hp.ssm_d_inner}, embedding_length {hp.n_embd})")


def load_mamba_layer(m: Model, layer: Layer, il: int) -> None:
    """A Mamba-1 layer's tensors: in/out projections, the conv, x -> (dt, B, C), dt's projection, A and D."""
    hp = m.hparams
    d_conv, d_inner, d_state, dt_rank = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
    layer.ssm_in = m.create_tensor(T.SSM_IN, (hp.n_embd, 2 * d_inner), il)
    layer.ssm_conv1d = m.create_tensor(T.SSM_CONV1D, (d_conv, d_inner), il)
    layer.ssm_conv1d_b = m.create_tensor(T.SSM_CONV1D, (d_inner,), il, "bias")
    layer.ssm_x = m.create_tensor(T.SSM_X, (d_inner, dt_rank + 2 * d_state), il)
    layer.ssm_dt = m.create_tensor(T.SSM_DT, (dt_rank, d_inner), il)
    layer.ssm_dt_b = m.create_tensor(T.SSM_DT, (d_inner,), il, "bias")
    layer.ssm_a = m.create_tensor(T.SSM_A, (d_state, d_inner), il, suffix=None)
    layer.ssm_d = m.create_tensor(T.SSM_D, (d_inner,), il, suffix=None)
    layer.ssm_out = m.create_tensor(T.SSM_OUT, (d_inner, hp.n_embd), il)


def load_mamba2_layer(m: Model, layer: Layer, il: int, norm_required: bool = True,
                      conv_bias_required: bool = True) -> None:
    """A Mamba-2 layer's tensors: one input projection to z, x, B, C and dt, the conv over x|B|C (and its
    bias), dt's bias, A and D per head, the grouped RMSNorm's weight and the output projection (the hybrids
    make the norm and the conv bias optional)."""
    hp = m.hparams
    d_conv, d_inner, d_state, n_group, n_head = (hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_n_group,
                                                 hp.ssm_dt_rank)
    require(n_group > 0 and d_inner % n_group == 0 and n_head > 0 and d_inner % n_head == 0,
            f"{hp.arch}: ssm.inner_size {d_inner} must split into {n_head} heads and {n_group} groups")
    conv_dim = d_inner + 2 * n_group * d_state
    layer.ssm_in = m.create_tensor(T.SSM_IN, (hp.n_embd, d_inner + conv_dim + n_head), il)
    layer.ssm_conv1d = m.create_tensor(T.SSM_CONV1D, (d_conv, conv_dim), il)
    layer.ssm_conv1d_b = m.create_tensor(T.SSM_CONV1D, (conv_dim,), il, "bias", required=conv_bias_required)
    layer.ssm_dt_b = m.create_tensor(T.SSM_DT, (n_head,), il, "bias")
    layer.ssm_a = m.create_tensor(T.SSM_A, (1, n_head), il, suffix=None)
    layer.ssm_d = m.create_tensor(T.SSM_D, (1, n_head), il, suffix=None)
    layer.ssm_norm = m.create_tensor(T.SSM_NORM, (d_inner // n_group, n_group), il, required=norm_required)
    layer.ssm_out = m.create_tensor(T.SSM_OUT, (d_inner, hp.n_embd), il)


def build_mamba_layer(g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """llm_build_mamba_base::build_mamba_layer: {n_embd, n_tokens} -> {n_embd, n_tokens}."""
    ctx, hp = g.ctx, g.hp
    d_conv, d_inner, d_state, dt_rank = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
    n_seqs, n_seq_tokens = g.n_seqs, g.n_seq_tokens
    conv_all, ssm_all = g.rs_r(il), g.rs_s(il)
    conv = B.reshape_3d(ctx, g.build_rs(conv_all, hp.n_embd_r(), n_seqs), d_conv - 1, d_inner, n_seqs)
    cur = B.reshape_3d(ctx, cur, cur.ne[0], n_seq_tokens, n_seqs)
    xz = g.mm(layer.ssm_in, cur)  # {2*d_inner, n_seq_tokens, n_seqs}
    x = B.view_3d(ctx, xz, d_inner, xz.ne[1], xz.ne[2], xz.nb[1], xz.nb[2], 0)
    z = B.view_3d(ctx, xz, d_inner, xz.ne[1], xz.ne[2], xz.nb[1], xz.nb[2], d_inner * xz.nb[0])
    # the causal conv over the saved window and the new columns; the last d_conv-1 columns are the next window
    conv_x = B.concat(ctx, conv, B.transpose(ctx, x), 0)
    last = B.view_3d(ctx, conv_x, d_conv - 1, d_inner, n_seqs, conv_x.nb[1], conv_x.nb[2], n_seq_tokens * conv_x.nb[0])
    g.store_rs(last, conv_all)
    x = B.ssm_conv(ctx, conv_x, layer.ssm_conv1d)
    x = B.silu(ctx, B.add(ctx, x, layer.ssm_conv1d_b))
    # the selective scan
    x_db = g.mm(layer.ssm_x, x)  # {dt_rank + 2*d_state, n_seq_tokens, n_seqs}
    es = x_db.nb[0]
    dt = B.view_3d(ctx, x_db, dt_rank, n_seq_tokens, n_seqs, x_db.nb[1], x_db.nb[2], 0)
    bb = B.view_4d(ctx, x_db, d_state, 1, n_seq_tokens, n_seqs, d_state * es, x_db.nb[1], x_db.nb[2], es * dt_rank)
    cc = B.view_4d(ctx, x_db, d_state, 1, n_seq_tokens, n_seqs, d_state * es, x_db.nb[1], x_db.nb[2],
                   es * (dt_rank + d_state))
    if hp.ssm_dt_b_c_rms or (layer.ssm_dt_norm is not None and layer.ssm_b_norm is not None
                             and layer.ssm_c_norm is not None):  # FalconMamba, Jamba
        dt = g.norm(dt, layer.ssm_dt_norm, "norm", il)
        bb = g.norm(bb, layer.ssm_b_norm, "norm", il)
        cc = g.norm(cc, layer.ssm_c_norm, "norm", il)
    else:
        dt = B.cont(ctx, dt)
    dt = B.add(ctx, g.mm(layer.ssm_dt, dt), layer.ssm_dt_b)  # {d_inner, n_seq_tokens, n_seqs}
    xc = x
    x = B.reshape_4d(ctx, x, 1, d_inner, n_seq_tokens, n_seqs)  # d_inner heads of dimension 1
    slots = ssm_all.ne[1]

    def scan(c: Context, states: Tensor, ids: Tensor) -> Tensor:
        ssm = B.reshape_4d(c, states, d_state, 1, d_inner, slots)
        return B.ssm_scan(c, ssm, x, dt, layer.ssm_a, bb, cc, ids, 1)

    y_ssm = g.build_rs(ssm_all, hp.n_embd_s(), n_seqs, scan)
    n_state = d_state * d_inner * n_seqs
    g.store_rs(B.view_1d(ctx, y_ssm, n_state, x.nb[3] * x.ne[3]), ssm_all)
    y = B.view_3d(ctx, y_ssm, d_inner, n_seq_tokens, n_seqs, x.nb[2], x.nb[3], 0)
    y = B.add(ctx, y, B.mul(ctx, xc, layer.ssm_d))
    y = B.swiglu_split(ctx, B.cont(ctx, z), y)
    cur = g.mm(layer.ssm_out, y)
    return B.reshape_2d(ctx, cur, cur.ne[0], n_seq_tokens * n_seqs)


def build_mamba2_layer(g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """llm_build_mamba_base::build_mamba2_layer (one state slot: no rollback snapshots); named mamba_out."""
    ctx, hp = g.ctx, g.hp
    d_conv, d_inner, d_state, n_group = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_n_group
    n_head = hp.ssm_dt_rank
    head_dim = d_inner // n_head
    n_seqs, n_seq_tokens = g.n_seqs, g.n_seq_tokens
    conv_dim = d_inner + 2 * n_group * d_state
    conv_all, ssm_all = g.rs_r(il), g.rs_s(il)
    conv = B.reshape_3d(ctx, g.build_rs(conv_all, hp.n_embd_r(), n_seqs), d_conv - 1, conv_dim, n_seqs)
    zx = g.mm(layer.ssm_in, cur)  # {d_in_proj, n_tokens}, kept 2-d as llama.cpp does
    zx = B.reshape_3d(ctx, zx, zx.ne[0], n_seq_tokens, n_seqs)
    es = zx.nb[0]
    z = B.view_4d(ctx, zx, head_dim, n_head, n_seq_tokens, n_seqs, head_dim * es, zx.nb[1], zx.nb[2], 0)
    xbc = B.view_3d(ctx, zx, conv_dim, n_seq_tokens, n_seqs, zx.nb[1], zx.nb[2], d_inner * es)
    dt = B.view_3d(ctx, zx, n_head, n_seq_tokens, n_seqs, zx.nb[1], zx.nb[2], (d_inner + conv_dim) * es)
    conv_x = B.concat(ctx, conv, B.transpose(ctx, xbc), 0)
    last = B.view_3d(ctx, conv_x, d_conv - 1, conv_dim, n_seqs, conv_x.nb[1], conv_x.nb[2], n_seq_tokens * conv_x.nb[0])
    g.store_rs(last, conv_all)
    xbc = B.ssm_conv(ctx, conv_x, layer.ssm_conv1d)
    if layer.ssm_conv1d_b is not None:
        xbc = B.add(ctx, xbc, layer.ssm_conv1d_b)
    xbc = B.silu(ctx, xbc)
    es = xbc.nb[0]
    x = B.view_4d(ctx, xbc, head_dim, n_head, n_seq_tokens, n_seqs, head_dim * es, xbc.nb[1], xbc.nb[2], 0)
    bb = B.view_4d(ctx, xbc, d_state, n_group, n_seq_tokens, n_seqs, d_state * es, xbc.nb[1], xbc.nb[2], d_inner * es)
    cc = B.view_4d(ctx, xbc, d_state, n_group, n_seq_tokens, n_seqs, d_state * es, xbc.nb[1], xbc.nb[2],
                   (d_inner + n_group * d_state) * es)
    dt = B.add(ctx, B.cont(ctx, dt), layer.ssm_dt_b)  # {n_head, n_seq_tokens, n_seqs}
    slots = ssm_all.ne[1]

    def scan(c: Context, states: Tensor, ids: Tensor) -> Tensor:
        ssm = B.reshape_4d(c, states, d_state, head_dim, n_head, slots)
        return B.ssm_scan(c, ssm, x, dt, layer.ssm_a, bb, cc, ids, 1)

    y_ssm = g.build_rs(ssm_all, hp.n_embd_s(), n_seqs, scan)
    n_state = d_state * d_inner * n_seqs
    g.store_rs(B.view_1d(ctx, y_ssm, n_state, x.nelements() * x.type.type_size), ssm_all)
    y = B.view_4d(ctx, y_ssm, head_dim, n_head, n_seq_tokens, n_seqs, x.nb[1], n_head * x.nb[1],
                  n_seq_tokens * n_head * x.nb[1], 0)
    y = g.cb(B.add(ctx, y, B.mul(ctx, x, layer.ssm_d)), "mamba2_y_add_d", il)
    y = B.swiglu_split(ctx, B.cont(ctx, z), y)
    if layer.ssm_norm is not None:  # the grouped RMSNorm
        y = B.reshape_4d(ctx, y, d_inner // n_group, n_group, n_seq_tokens, n_seqs)
        y = g.norm(y, layer.ssm_norm, "norm", il)
    y = B.reshape_2d(ctx, y, d_inner, n_seq_tokens * n_seqs)
    return g.cb(g.mm(layer.ssm_out, y), "mamba_out", il)
