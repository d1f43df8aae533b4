"""A GGUF language model: hyper-parameters, vocabulary and weights in backend buffers.

On the CPU the weights are never copied: each weight tensor's data points into the mmap'd file,
through a ``CPU_Mapped`` buffer marked with WEIGHTS usage (llama.cpp's use_mmap path). Weights
stay in their stored (quantized) type; kernels dequantize row tiles as they go.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import memory
from ..backend.api import backend_buffer_set_usage, backend_tensor_alloc
from ..backend.base import Buffer, BufferUsage
from ..backend.cpu.backend import cpu_buffer_from_ptr
from ..context import Context, tensor_overhead
from ..gguf import GGUFReader
from ..tensor import Tensor
from .hparams import HParams, ModelLoadError


@dataclass
class Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    bo: Tensor | None = None
    attn_q_norm: Tensor | None = None
    attn_k_norm: Tensor | None = None
    attn_post_norm: Tensor | None = None
    ffn_post_norm: Tensor | None = None
    ffn_gate_b: Tensor | None = None
    ffn_up_b: Tensor | None = None
    ffn_down_b: Tensor | None = None


class Model:
    """``llama_model``: ``Model(path)`` maps a GGUF file and exposes its weights as pyggml tensors."""

    def __init__(self, path: str | Path, progress: bool = True) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        self.reader = GGUFReader(self.path)
        self.hparams = HParams.from_metadata(self.reader)
        self.arch = self.hparams.arch
        infos = self.reader.tensors
        self.ctx = Context((len(infos) + 2) * tensor_overhead(), no_alloc=True)
        # the whole file as one zero-copy CPU_Mapped buffer with WEIGHTS usage
        file_bytes = np.frombuffer(self.reader._buf, dtype=np.uint8)
        memory.register(file_bytes)
        self._file_bytes = file_bytes
        self.buffer: Buffer = cpu_buffer_from_ptr(file_bytes)
        backend_buffer_set_usage(self.buffer, BufferUsage.WEIGHTS)
        base = memory.address_of(file_bytes)
        self.tensors: dict[str, Tensor] = {}
        items = infos
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            items = tqdm(infos, desc=f"loading {self.path.name}", unit="tensor", file=sys.stderr, leave=False)
        for ti in items:
            t = self.ctx.new_tensor(ti.type, *ti.ne[: max(ti.n_dims, 1)]).set_name(ti.name)
            backend_tensor_alloc(self.buffer, t, base + self.reader.data_offset + ti.offset)
            self.tensors[ti.name] = t
        self._build_layers()

    # ------------------------------------------------------------------ tensors
    def _get(self, name: str, ne: tuple[int, ...] | None = None, required: bool = True) -> Tensor | None:
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise ModelLoadError(f"{self.path.name}: missing tensor {name!r}")
            return None
        if ne is not None and tuple(t.ne[: len(ne)]) != ne:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has shape {t.ne[:len(ne)]}, expected {list(ne)}")
        return t

    def _build_layers(self) -> None:
        hp = self.hparams
        g = self._get
        self.tok_embd = g("token_embd.weight", (hp.n_embd,))
        if hp.n_vocab == 0:
            hp.n_vocab = self.tok_embd.ne[1]
        self.output_norm = g("output_norm.weight", (hp.n_embd,))
        out = g("output.weight", (hp.n_embd, hp.n_vocab), required=False)
        self.output = out if out is not None else self.tok_embd  # tied embeddings
        self.output_b = g("output.bias", required=False)
        self.rope_freqs = g("rope_freqs.weight", required=False)
        self.layers: list[Layer] = []
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            n_embd_q = hp.n_embd_head_k * hp.n_head[il]
            layer = Layer(
                attn_norm=g(p + "attn_norm.weight", (hp.n_embd,)),
                wq=g(p + "attn_q.weight", (hp.n_embd, n_embd_q)),
                wk=g(p + "attn_k.weight", (hp.n_embd, hp.n_embd_k_gqa(il))),
                wv=g(p + "attn_v.weight", (hp.n_embd, hp.n_embd_v_gqa(il))),
                wo=g(p + "attn_output.weight", (hp.n_embd_head_v * hp.n_head[il], hp.n_embd)),
                ffn_norm=g(p + "ffn_norm.weight", (hp.n_embd,)),
                ffn_gate=g(p + "ffn_gate.weight", (hp.n_embd, hp.n_ff[il])),
                ffn_up=g(p + "ffn_up.weight", (hp.n_embd, hp.n_ff[il])),
                ffn_down=g(p + "ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
                bq=g(p + "attn_q.bias", required=False),
                bk=g(p + "attn_k.bias", required=False),
                bv=g(p + "attn_v.bias", required=False),
                bo=g(p + "attn_output.bias", required=False),
                attn_q_norm=g(p + "attn_q_norm.weight", required=False),
                attn_k_norm=g(p + "attn_k_norm.weight", required=False),
                attn_post_norm=g(p + "post_attention_norm.weight", required=False),
                ffn_post_norm=g(p + "post_ffw_norm.weight", required=False),
                ffn_gate_b=g(p + "ffn_gate.bias", required=False),
                ffn_up_b=g(p + "ffn_up.bias", required=False),
                ffn_down_b=g(p + "ffn_down.bias", required=False),
            )
            if self.arch == "gemma3" and None in (layer.attn_q_norm, layer.attn_k_norm, layer.attn_post_norm,
                                                   layer.ffn_post_norm):
                raise ModelLoadError(f"{self.path.name}: gemma3 layer {il} lacks its q/k/post norms")
            self.layers.append(layer)

    def metadata(self, key: str, default: object = None) -> object:
        return self.reader.get(key, default)

    def n_params(self) -> int:
        return sum(t.nelements() for t in self.tensors.values())

    def size_bytes(self) -> int:
        return sum(t.nbytes() for t in self.tensors.values())
