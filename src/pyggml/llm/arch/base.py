"""What an architecture is: its hyper-parameter keys, its tensors and its graph (llama.cpp's
``llama_model_<arch>`` with ``load_arch_hparams``, ``load_arch_tensors`` and its ``graph``), and the
loading steps most architectures share (``create_tensor_qkv`` and the embedding/output tensors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ...gguf.constants import Keys
from ..hparams import KV, LLAMA_ROPE_TYPE_NEOX, LLAMA_ROPE_TYPE_NORM, HParams, ModelLoadError
from ..tensors import LLMTensor as T

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..model import Layer, Model

__all__ = ["LLAMA_ROPE_TYPE_NEOX", "LLAMA_ROPE_TYPE_NORM", "Arch", "load_cls_head", "load_embd_output", "load_ffn",
           "load_moe", "load_qkv", "require"]


class Arch:
    """One architecture; a subclass per ``general.architecture`` value, registered by ``@register``."""

    name: ClassVar[str]
    #: llama_model_rope_type: NORM (adjacent pairs), NEOX (halves) or NONE
    rope_type: ClassVar[int] = LLAMA_ROPE_TYPE_NORM
    #: False for the encoders llama_model::create_memory gives no memory: no KV cache, each batch is one
    #: ubatch whose tokens attend to each other (llama_context::encode)
    has_memory: ClassVar[bool] = True
    #: False when the graph ends at the hidden states (t_embd) without a vocabulary projection
    has_logits: ClassVar[bool] = True
    #: True for a model with recurrent layers (llm_arch_is_recurrent, or llm_arch_is_hybrid with ``hybrid``):
    #: their states live in a RecurrentMemory (llm/memory_recurrent.py), the layers ``recr_layers`` names
    recurrent: ClassVar[bool] = False
    #: True when attention layers (``attn_layers``) keep a KV cache beside the recurrent memory (llama.cpp's
    #: llama_memory_hybrid)
    hybrid: ClassVar[bool] = False

    def attn_layers(self, hp: HParams) -> list[int]:
        """The layers with a KV cache (llama_memory_hybrid's filter_attn): the ones that are not recurrent."""
        return [il for il in range(hp.n_layer) if not hp.is_recurrent(il)]

    def recr_layers(self, hp: HParams) -> list[int]:
        """The layers with a recurrent state (filter_recr): hparams.is_recurrent(il)."""
        return [il for il in range(hp.n_layer) if hp.is_recurrent(il)]

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        """load_arch_hparams: the keys this architecture adds to the generic ones (RMSNorm's eps by default)."""
        hp.f_norm_rms_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_RMS_EPS))

    def load_tensors(self, m: Model) -> None:
        """load_arch_tensors: set ``m``'s global tensors and every ``m.layers[il]`` field it has."""
        raise NotImplementedError

    def build_graph(self, g: GraphBuilder) -> Tensor | None:
        """The forward graph of one ubatch; returns the logits tensor (``g.finish``), or None for a model
        without an output head, which leaves its hidden states in ``g.t_embd`` (``g.finish_embd``)."""
        raise NotImplementedError


def load_embd_output(m: Model, output_required: bool = False, output_bias: bool = False,
                     norm_bias: bool = False) -> None:
    """token_embd, output_norm and output; a missing output reuses the token embeddings (tied)."""
    hp = m.hparams
    m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (hp.n_embd, hp.n_vocab))
    m.output_norm = m.create_tensor(T.OUTPUT_NORM, (hp.n_embd,))
    if norm_bias:
        m.output_norm_b = m.create_tensor(T.OUTPUT_NORM, (hp.n_embd,), suffix="bias")
    m.output = m.create_tensor(T.OUTPUT, (hp.n_embd, hp.n_vocab), required=output_required) or m.tied_output()
    if output_bias:
        m.output_b = m.create_tensor(T.OUTPUT, (hp.n_vocab,), suffix="bias", required=False)


def load_cls_head(m: Model) -> None:
    """The optional classifier head RANK pooling runs: ``cls`` {n_embd, n_embd} and ``cls.output``
    {n_embd, n_cls_out}, each with its bias."""
    hp = m.hparams
    m.cls = m.create_tensor(T.CLS, (hp.n_embd, hp.n_embd), required=False)
    m.cls_b = m.create_tensor(T.CLS, (hp.n_embd,), suffix="bias", required=False)
    m.cls_out = m.create_tensor(T.CLS_OUT, (hp.n_embd, hp.n_cls_out), required=False)
    m.cls_out_b = m.create_tensor(T.CLS_OUT, (hp.n_cls_out,), suffix="bias", required=False)


def load_qkv(m: Model, layer: Layer, il: int, biases: bool = True) -> None:
    """create_tensor_qkv: a fused attn_qkv (with its bias) when the file has one, else attn_q/k/v;
    then attn_output. Biases are optional where the architecture allows them."""
    hp = m.hparams
    n_q = hp.n_embd_head_k * hp.n_head[il]
    n_k, n_v = hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
    layer.wqkv = m.create_tensor(T.ATTN_QKV, (hp.n_embd, n_q + n_k + n_v), il, required=False)
    if layer.wqkv is not None:
        layer.bqkv = m.create_tensor(T.ATTN_QKV, (n_q + n_k + n_v,), il, "bias", required=False)
    else:
        layer.wq = m.create_tensor(T.ATTN_Q, (hp.n_embd, n_q), il)
        layer.wk = m.create_tensor(T.ATTN_K, (hp.n_embd, n_k), il)
        layer.wv = m.create_tensor(T.ATTN_V, (hp.n_embd, n_v), il)
        if biases:
            layer.bq = m.create_tensor(T.ATTN_Q, (n_q,), il, "bias", required=False)
            layer.bk = m.create_tensor(T.ATTN_K, (n_k,), il, "bias", required=False)
            layer.bv = m.create_tensor(T.ATTN_V, (n_v,), il, "bias", required=False)
    layer.wo = m.create_tensor(T.ATTN_OUT, (hp.n_embd_head_v * hp.n_head[il], hp.n_embd), il)
    if biases:
        layer.bo = m.create_tensor(T.ATTN_OUT, (hp.n_embd,), il, "bias", required=False)


def load_ffn(m: Model, layer: Layer, il: int, gate: bool = True, biases: bool = False) -> None:
    """ffn_up / ffn_down (and ffn_gate for a gated FFN), with their optional biases."""
    hp = m.hparams
    n_ff = hp.n_ff[il]
    if gate:
        layer.ffn_gate = m.create_tensor(T.FFN_GATE, (hp.n_embd, n_ff), il)
    layer.ffn_up = m.create_tensor(T.FFN_UP, (hp.n_embd, n_ff), il)
    layer.ffn_down = m.create_tensor(T.FFN_DOWN, (n_ff, hp.n_embd), il)
    if biases:
        if gate:
            layer.ffn_gate_b = m.create_tensor(T.FFN_GATE, (n_ff,), il, "bias", required=False)
        layer.ffn_up_b = m.create_tensor(T.FFN_UP, (n_ff,), il, "bias", required=False)
        layer.ffn_down_b = m.create_tensor(T.FFN_DOWN, (hp.n_embd,), il, "bias", required=False)


def load_moe(m: Model, layer: Layer, il: int, n_ff_exp: int = 0, gate_required: bool = False) -> None:
    """The router (ffn_gate_inp) and the experts' stacked ffn_gate/up/down_exps ({.., .., n_expert});
    a shared expert (ffn_*_shexp) when the file gives its size. ``n_ff_exp`` defaults to the expert FFN
    length key, else the FFN length."""
    hp = m.hparams
    require(hp.n_expert_used > 0, f"{hp.arch}: {hp.n_expert} experts but expert_used_count is 0")
    n_ff = n_ff_exp or hp.n_ff_exp or hp.n_ff[il]
    layer.ffn_gate_inp = m.create_tensor(T.FFN_GATE_INP, (hp.n_embd, hp.n_expert), il)
    layer.ffn_gate_exps = m.create_tensor(T.FFN_GATE_EXPS, (hp.n_embd, n_ff, hp.n_expert), il,
                                          required=gate_required)
    layer.ffn_up_exps = m.create_tensor(T.FFN_UP_EXPS, (hp.n_embd, n_ff, hp.n_expert), il)
    layer.ffn_down_exps = m.create_tensor(T.FFN_DOWN_EXPS, (n_ff, hp.n_embd, hp.n_expert), il)
    if hp.n_ff_shexp:
        layer.ffn_gate_shexp = m.create_tensor(T.FFN_GATE_SHEXP, (hp.n_embd, hp.n_ff_shexp), il)
        layer.ffn_up_shexp = m.create_tensor(T.FFN_UP_SHEXP, (hp.n_embd, hp.n_ff_shexp), il)
        layer.ffn_down_shexp = m.create_tensor(T.FFN_DOWN_SHEXP, (hp.n_ff_shexp, hp.n_embd), il)


def require(cond: bool, what: str) -> None:
    """A load-time check of the file's shape facts, as llama.cpp's GGML_ASSERTs in a graph constructor."""
    if not cond:
        raise ModelLoadError(what)
