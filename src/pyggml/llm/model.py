"""A GGUF language model: hyper-parameters, vocabulary and weights in backend buffers.

On the CPU the weights are never copied: each weight tensor's data points into the mmap'd file,
through a ``CPU_Mapped`` buffer marked with WEIGHTS usage (llama.cpp's use_mmap path). Weights
stay in their stored (quantized) type; kernels dequantize row tiles as they go.

Placement follows llama.cpp: with ``n_gpu_layers = k`` the last ``k - 1`` repeating layers and
the output head go to the offload devices (split evenly over several), the token embeddings stay
on the CPU, and ``override_tensor`` rules (regex on the tensor name -> buffer type name, first
match wins) come before everything else. Weights on another device are copied there once.
"""

from __future__ import annotations

import mmap
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import memory
from ..backend.api import backend_buffer_set_usage, backend_tensor_alloc, backend_tensor_set
from ..backend.base import Buffer, BufferType, BufferUsage, Device, DeviceType
from ..backend.registry import backend_dev_by_type, backend_devices
from ..context import Context, tensor_overhead
from ..gguf import GGUFReader
from ..tensor import Tensor, ggml_pad
from ..types import GGMLType
from .arch import Arch, arch_of
from .hparams import HParams, ModelLoadError
from .tensors import LLMTensor

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def cpu_device() -> Device:
    """The CPU device, asked of the backend registry as llama.cpp does (ggml_backend_dev_by_type)."""
    dev = backend_dev_by_type(DeviceType.CPU)
    if dev is None:
        raise ModelLoadError("no CPU device is registered with the backend registry")
    return dev


@dataclass
class Layer:
    """llama_layer: one block's weights; an architecture fills the ones it has (the rest stay None)."""

    attn_norm: Tensor | None = None
    attn_norm_b: Tensor | None = None
    wq: Tensor | None = None
    wk: Tensor | None = None
    wv: Tensor | None = None
    wqkv: Tensor | None = None
    wo: Tensor | None = None
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    bqkv: Tensor | None = None
    bo: Tensor | None = None
    attn_q_norm: Tensor | None = None
    attn_q_norm_b: Tensor | None = None
    attn_k_norm: Tensor | None = None
    attn_k_norm_b: Tensor | None = None
    attn_post_norm: Tensor | None = None
    attn_sinks: Tensor | None = None
    attn_out_norm: Tensor | None = None
    attn_out_norm_b: Tensor | None = None
    layer_out_norm: Tensor | None = None
    layer_out_norm_b: Tensor | None = None
    # LFM2's short convolution blocks
    shortconv_conv: Tensor | None = None
    shortconv_in_proj: Tensor | None = None
    shortconv_out_proj: Tensor | None = None
    # RWKV blocks (time mix and channel mix) and their second LayerNorm
    attn_norm_2: Tensor | None = None
    attn_norm_2_b: Tensor | None = None
    time_mix_w0: Tensor | None = None
    time_mix_w1: Tensor | None = None
    time_mix_w2: Tensor | None = None
    time_mix_a0: Tensor | None = None
    time_mix_a1: Tensor | None = None
    time_mix_a2: Tensor | None = None
    time_mix_v0: Tensor | None = None
    time_mix_v1: Tensor | None = None
    time_mix_v2: Tensor | None = None
    time_mix_g1: Tensor | None = None
    time_mix_g2: Tensor | None = None
    time_mix_lerp_x: Tensor | None = None
    time_mix_lerp_w: Tensor | None = None
    time_mix_lerp_k: Tensor | None = None
    time_mix_lerp_v: Tensor | None = None
    time_mix_lerp_r: Tensor | None = None
    time_mix_lerp_g: Tensor | None = None
    time_mix_lerp_fused: Tensor | None = None
    time_mix_first: Tensor | None = None
    time_mix_decay: Tensor | None = None
    time_mix_decay_w1: Tensor | None = None
    time_mix_decay_w2: Tensor | None = None
    time_mix_key: Tensor | None = None
    time_mix_value: Tensor | None = None
    time_mix_receptance: Tensor | None = None
    time_mix_gate: Tensor | None = None
    time_mix_ln: Tensor | None = None
    time_mix_output: Tensor | None = None
    time_mix_k_k: Tensor | None = None
    time_mix_k_a: Tensor | None = None
    time_mix_r_k: Tensor | None = None
    time_mix_ln_b: Tensor | None = None
    time_mix_key_b: Tensor | None = None
    time_mix_value_b: Tensor | None = None
    time_mix_receptance_b: Tensor | None = None
    channel_mix_lerp_k: Tensor | None = None
    channel_mix_lerp_r: Tensor | None = None
    channel_mix_key: Tensor | None = None
    channel_mix_value: Tensor | None = None
    channel_mix_receptance: Tensor | None = None
    ffn_norm: Tensor | None = None
    ffn_norm_b: Tensor | None = None
    ffn_gate: Tensor | None = None
    ffn_up: Tensor | None = None
    ffn_down: Tensor | None = None
    ffn_gate_b: Tensor | None = None
    ffn_up_b: Tensor | None = None
    ffn_down_b: Tensor | None = None
    ffn_post_norm: Tensor | None = None
    ffn_gate_inp: Tensor | None = None
    ffn_gate_inp_b: Tensor | None = None
    ffn_gate_exps: Tensor | None = None
    ffn_up_exps: Tensor | None = None
    ffn_down_exps: Tensor | None = None
    ffn_gate_exps_b: Tensor | None = None
    ffn_up_exps_b: Tensor | None = None
    ffn_down_exps_b: Tensor | None = None
    ffn_gate_shexp: Tensor | None = None
    ffn_up_shexp: Tensor | None = None
    ffn_down_shexp: Tensor | None = None
    rope_freqs: Tensor | None = None
    rope_long: Tensor | None = None
    rope_short: Tensor | None = None
    # state-space (Mamba) layers
    ssm_in: Tensor | None = None
    ssm_conv1d: Tensor | None = None
    ssm_conv1d_b: Tensor | None = None
    ssm_x: Tensor | None = None
    ssm_dt: Tensor | None = None
    ssm_dt_b: Tensor | None = None
    ssm_a: Tensor | None = None
    ssm_d: Tensor | None = None
    ssm_norm: Tensor | None = None
    ssm_dt_norm: Tensor | None = None
    ssm_b_norm: Tensor | None = None
    ssm_c_norm: Tensor | None = None
    ssm_out: Tensor | None = None


class Model:
    """``llama_model``: ``Model(path)`` maps a GGUF file and exposes its weights as pyggml tensors."""

    def __init__(self, path: str | Path, progress: bool = True, n_gpu_layers: int = 0,
                 devices: Sequence[Device] | None = None,
                 override_tensor: Sequence[tuple[str, str]] = (), use_extra_bufts: bool = True) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        self.reader = GGUFReader(self.path)
        self.arch: Arch = arch_of(self.reader)
        self.hparams = HParams.load(self.reader, self.arch)
        infos = self.reader.tensors
        self.ctx = Context((len(infos) + 2) * tensor_overhead(), no_alloc=True)
        self._placement = _Placement(self.hparams.n_layer, n_gpu_layers, devices, override_tensor, use_extra_bufts,
                                     self.hparams.n_expert_used)
        # the whole file as one zero-copy CPU_Mapped buffer with WEIGHTS usage
        file_bytes = np.frombuffer(self.reader._buf, dtype=np.uint8)
        memory.register(file_bytes)
        self._file_bytes = file_bytes
        base = memory.address_of(file_bytes)
        max_tensor = max((ti.nbytes for ti in infos), default=0)
        self.buffer: Buffer = cpu_device().buffer_from_host_ptr(base, file_bytes.nbytes, max_tensor)
        backend_buffer_set_usage(self.buffer, BufferUsage.WEIGHTS)
        self.buffers: list[Buffer] = [self.buffer]
        self.tensors: dict[str, Tensor] = {}
        elsewhere: dict[BufferType, list[tuple[Tensor, np.ndarray]]] = {}
        items = infos
        if progress and sys.stderr.isatty():
            items = tqdm(infos, desc=f"loading {self.path.name}", unit="tensor", file=sys.stderr, leave=False)
        for ti in items:
            t = self.ctx.new_tensor(ti.type, *ti.ne[: max(ti.n_dims, 1)]).set_name(ti.name)
            buft = self._placement.buft_for(ti.name) or self._placement.extra_buft_for(t)
            if buft is None:
                backend_tensor_alloc(self.buffer, t, base + self.reader.data_offset + ti.offset)
            else:
                elsewhere.setdefault(buft, []).append((t, self.reader.tensor_bytes(ti.name)))
            self.tensors[ti.name] = t
        self._tied_output: Tensor | None = None
        if "output.weight" not in self.tensors and "token_embd.weight" in self.tensors:
            # llama.cpp duplicates tied embeddings for the output layer's device (TENSOR_DUPLICATED)
            buft = self._placement.buft_for("output.weight")
            if buft is not None:
                emb = self.tensors["token_embd.weight"]
                dup = self.ctx.new_tensor(emb.type, *emb.ne[: emb.n_dims()]).set_name("output.weight")
                elsewhere.setdefault(buft, []).append((dup, self.reader.tensor_bytes("token_embd.weight")))
                self._tied_output = dup
        for buft, group in elsewhere.items():
            done = self._release_pages if buft in self._placement.extra_bufts else None
            self.buffers.append(_upload(buft, group, done))
        self._build_layers()

    def _release_pages(self, t: Tensor) -> None:
        """Drop the mapped file pages of a weight just copied into a CPU extra buffer (repacked): the kernels
        never read them again, and resident they would count twice (llama.cpp unmaps them)."""
        mm = getattr(self.reader, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or t is self._tied_output:
            return  # (a tied output is a copy of the token embeddings, which GET_ROWS still reads)
        page = mmap.PAGESIZE
        start = self.reader.tensor_file_offset(t.name)
        lo, hi = -(-start // page) * page, (start + t.nbytes()) // page * page
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    @property
    def devices(self) -> list[Device]:
        """The devices other than the CPU that hold weights (the scheduler needs their backends)."""
        return self._placement.used_devices()

    def layer_buft(self, il: int) -> BufferType:
        """The buffer type of layer ``il`` (its KV cache lives there too, as with offload_kqv)."""
        return self._placement.buft_for(f"blk.{il}.attn_norm.weight") or self._placement.cpu_buft

    # ------------------------------------------------------------------ tensors
    def create_tensor(self, kind: LLMTensor, shape: tuple[int, ...], il: int | None = None, suffix: str = "weight",
                      required: bool = True) -> Tensor | None:
        """llama_model_loader::create_tensor: the named weight, its leading dimensions checked against
        ``shape``; a missing optional one is None, a missing required one a ModelLoadError."""
        name = kind.name_of(suffix, il)
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise ModelLoadError(f"{self.path.name}: missing tensor {name!r}")
            return None
        if tuple(t.ne[: len(shape)]) != tuple(shape):
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has shape {t.ne[:len(shape)]}, "
                                 f"expected {list(shape)}")
        return t

    def tied_output(self) -> Tensor:
        """The output projection when the file has none: the token embeddings (llama.cpp's
        TENSOR_DUPLICATED), or their copy on the output layer's device."""
        return self._tied_output if self._tied_output is not None else self.tok_embd

    def rope_factors(self, il: int, n_ctx_seq: int) -> Tensor | None:
        """llama_model::get_rope_factors: the layer's frequency factors; LongRoPE's long ones when the
        per-sequence context exceeds the original training context."""
        layer = self.layers[il]
        if layer.rope_freqs is not None:
            return layer.rope_freqs
        return layer.rope_long if n_ctx_seq > self.hparams.n_ctx_orig_yarn else layer.rope_short

    def _build_layers(self) -> None:
        self.tok_embd: Tensor | None = None
        self.output_norm: Tensor | None = None
        self.output_norm_b: Tensor | None = None
        self.output: Tensor | None = None
        self.output_b: Tensor | None = None
        self.pos_embd: Tensor | None = None
        self.type_embd: Tensor | None = None  # token_types: BERT's segment embeddings
        self.tok_norm: Tensor | None = None  # token_embd_norm: the LayerNorm after the embeddings
        self.tok_norm_b: Tensor | None = None
        # the classifier head that RANK pooling runs (cls: a dense layer and tanh, cls.output: the scores)
        self.cls: Tensor | None = None
        self.cls_b: Tensor | None = None
        self.cls_out: Tensor | None = None
        self.cls_out_b: Tensor | None = None
        # sentence-transformers' dense projections applied after pooling
        self.dense_2: Tensor | None = None
        self.dense_3: Tensor | None = None
        self.layers: list[Layer] = [Layer() for _ in range(self.hparams.n_layer)]
        embd = self.tensors.get(LLMTensor.TOKEN_EMBD.name_of())
        if self.hparams.n_vocab == 0 and embd is not None:  # a file without a vocabulary
            self.hparams.n_vocab = embd.ne[1]
        self.arch.load_tensors(self)

    def metadata(self, key: str, default: object = None) -> object:
        return self.reader.get(key, default)

    def n_params(self) -> int:
        return sum(t.nelements() for t in self.tensors.values())

    def size_bytes(self) -> int:
        return sum(t.nbytes() for t in self.tensors.values())


def _upload(buft: BufferType, group: list[tuple[Tensor, np.ndarray]],
            done: Callable[[Tensor], None] | None = None) -> Buffer:
    """One WEIGHTS buffer of ``buft`` holding ``group``'s tensors, their bytes copied from the file
    (``done(t)`` after each)."""
    align = buft.get_alignment()
    sizes = [ggml_pad(buft.get_alloc_size(t), align) for t, _ in group]
    buf = buft.alloc_buffer(sum(sizes))
    backend_buffer_set_usage(buf, BufferUsage.WEIGHTS)
    addr = buf.get_base()
    for (t, data), size in zip(group, sizes, strict=True):
        backend_tensor_alloc(buf, t, addr)
        backend_tensor_set(t, data)
        if done is not None:
            done(t)
        addr += size
    return buf


def _test_mul_mat(buft: BufferType, w: Tensor, n_expert_used: int = 1) -> bool:
    """Whether buft's device computes the weight's op with w in a (zero-size) buffer of buft: MUL_MAT by
    f32[ne0, 512], or for a stack of experts MUL_MAT_ID by n_expert_used rows of 512 tokens (llama.cpp's
    weight_buft_supported)."""
    from ..ops.mat import mul_mat, mul_mat_id  # deferred: the op builders are only needed for this test

    if w.n_dims() > 3:  # not a matrix or a stack of experts (RWKV's fused token-shift mixes, read by MUL/ADD),
        return False  # which the extra (repacking) buffer types never compute
    ctx = Context(4 * tensor_overhead(), no_alloc=True)
    wt = ctx.new_tensor(w.type, *w.ne[: w.n_dims()])
    wt.buffer = buft.alloc_buffer(0)
    if w.n_dims() == 3:
        n_used = max(n_expert_used, 1)
        ids = ctx.new_tensor(GGMLType.I32, n_used, 512)
        op = mul_mat_id(ctx, wt, ctx.new_tensor(GGMLType.F32, w.ne[0], n_used, 512), ids)
    else:
        op = mul_mat(ctx, wt, ctx.new_tensor(GGMLType.F32, w.ne[0], 512))
    dev = buft.get_device()
    return dev is not None and dev.supports_op(op)


class _Placement:
    """Which buffer type each weight goes to (None: the CPU, mapped from the file)."""

    def __init__(self, n_layer: int, n_gpu_layers: int, devices: Sequence[Device] | None,
                 override_tensor: Sequence[tuple[str, str]], use_extra_bufts: bool = True,
                 n_expert_used: int = 0) -> None:
        self.n_expert_used = n_expert_used
        # enumerating devices imports their backends (torch is heavy): only when placement needs them
        need_devices = n_gpu_layers != 0 and devices is None
        all_devs = backend_devices() if need_devices or override_tensor else list(devices or [])
        if devices is None:
            devices = [d for d in all_devs if d.type() == DeviceType.GPU] if need_devices else []
        self.gpus = list(devices)
        self.n_layer = n_layer
        ngl = n_gpu_layers if n_gpu_layers >= 0 else n_layer + 1
        self.i_gpu_start = max(n_layer + 1 - ngl, 0) if self.gpus else n_layer + 1
        self.act_gpu_layers = n_layer + 1 - self.i_gpu_start
        cpu = cpu_device()
        self.cpu_buft = cpu.get_buffer_type()
        extra = cpu.reg.get_proc_address("ggml_backend_dev_get_extra_bufts") if cpu.reg is not None else None
        #: the CPU's extra buffer types (CPU_REPACK), tried before the plain CPU buffer (llama.cpp's CPU list)
        self.extra_bufts: list[BufferType] = list(extra(cpu)) if extra is not None and use_extra_bufts else []
        self._supported: dict[tuple, bool] = {}
        bufts = {self.cpu_buft.name(): self.cpu_buft}
        for d in all_devs:
            bt = d.get_buffer_type()
            bufts.setdefault(bt.name(), bt)
        self.overrides: list[tuple[re.Pattern[str], BufferType | None]] = []
        for pattern, name in override_tensor:
            bt = next((b for n, b in bufts.items() if n.lower() == name.lower()), None)
            if bt is None:
                raise ModelLoadError(f"--override-tensor: unknown buffer type {name!r} "
                                     f"(available: {', '.join(sorted(bufts))})")
            try:
                rx = re.compile(pattern)
            except re.error as e:
                raise ModelLoadError(f"--override-tensor: bad regular expression {pattern!r}: {e}") from e
            self.overrides.append((rx, None if bt is self.cpu_buft else bt))
        self._used: list[Device] = []

    def _layer_of(self, name: str) -> int | None:
        """llama.cpp's layer classes: blk.N -> N; output / output_norm -> the output layer; else input."""
        m = _LAYER_RE.match(name)
        if m:
            return int(m.group(1))
        if name.startswith(("output.", "output_norm.")):
            return self.n_layer
        if name.startswith("rope_freqs."):
            return 0
        return None

    def buft_for(self, name: str) -> BufferType | None:
        for rx, bt in self.overrides:
            if rx.search(name):
                return self._note(bt)
        il = self._layer_of(name)
        if il is None or il < self.i_gpu_start or not self.gpus:
            return None
        # the cumulative split over the offload devices, even by default (llama.cpp's tensor_split)
        idx = min(len(self.gpus) - 1, (il - self.i_gpu_start) * len(self.gpus) // self.act_gpu_layers)
        return self._note(self.gpus[idx].get_buffer_type())

    def extra_buft_for(self, t: Tensor) -> BufferType | None:
        """The first CPU extra buffer type whose device computes the weight's test op (llama.cpp's
        weight_buft_supported): MUL_MAT by 512 F32 rows for every weight but the token embeddings,
        which GET_ROWS reads. None: the plain CPU buffer (the mapped file)."""
        if t.name == "token_embd.weight":
            return None
        for buft in self.extra_bufts:
            key = (id(buft), t.type, tuple(t.ne))
            if key not in self._supported:
                self._supported[key] = _test_mul_mat(buft, t, self.n_expert_used)
            if self._supported[key]:
                return buft
        return None

    def _note(self, bt: BufferType | None) -> BufferType | None:
        if bt is not None and bt.device is not None and bt.device not in self._used:
            self._used.append(bt.device)
        return bt

    def used_devices(self) -> list[Device]:
        return list(self._used)
