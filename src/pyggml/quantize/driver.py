"""``quantize_model``: llama.cpp's ``llama_model_quantize`` (src/llama-quant.cpp), byte for byte.

The output file has the input's metadata (plus ``general.quantization_version``, ``general.file_type``,
the overrides and the ``quantize.imatrix.*`` keys, in llama.cpp's order), the tensors in the loader's
order (by layer, then name), each converted to the type :class:`~.rules.TypeChooser` picks. The codecs
spread each matrix's rows over ``nthread`` threads (quants.chunks); the file is written to a temporary name
and renamed, so an error or Ctrl-C never leaves a half-written output.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import quants
from ..gguf import GGUF_DEFAULT_ALIGNMENT, GGUFError, GGUFReader, GGUFWriter
from ..gguf.constants import Keys
from ..gguf.records import TensorInfo
from ..quants import chunks
from ..tensor_data import bf16_to_f32
from ..types import GGMLType
from .convert_ops import as_type_opt
from .errors import QuantizeError
from .ftypes import LlamaFType, ftype_default_type, guess_ftype, parse_ftype
from .imatrix_io import IMatrix, load_imatrix
from .overrides import KVOverride
from .rules import (
    ModelInfo,
    QuantParams,
    TypeChooser,
    allows_quantization,
    is_token_embd,
    requires_imatrix,
    weight_order,
)

GGML_QNT_VERSION = 2
#: llama.cpp's LLAMA_QUANT_MAX_BUF_SIZE: the most tensor data held while quantizing one tensor
MAX_BUF_SIZE = 8 * 1024**3


@dataclass
class QuantizeOptions:
    """Everything ``pyggml quantize`` accepts besides the files and the type (see its ``--help``)."""

    nthread: int = 0
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    output_tensor_type: GGMLType | str | None = None
    token_embedding_type: GGMLType | str | None = None
    tensor_types: list[tuple[str, GGMLType]] = field(default_factory=list)
    prune_layers: list[int] = field(default_factory=list)
    imatrix: str | os.PathLike[str] | IMatrix | None = None
    include_weights: list[str] = field(default_factory=list)
    exclude_weights: list[str] = field(default_factory=list)
    kv_overrides: list[KVOverride] = field(default_factory=list)
    dry_run: bool = False
    #: bytes of rows (source + float32 + result) quantized at a time (``--max-buffer-size``)
    max_buffer_size: int = MAX_BUF_SIZE
    progress: bool = True
    verbose: bool = False


@dataclass
class TensorPlan:
    """One output tensor: where it comes from, its (possibly renamed) name and target type."""

    src: TensorInfo
    name: str
    new_type: GGMLType
    requires_imatrix: bool
    imatrix_name: str


@dataclass
class QuantizeResult:
    """What was (or, for a dry run, would be) written."""

    plans: list[TensorPlan]
    size_in: int
    size_out: int
    n_fallback: int
    path: Path | None


def _imatrix_data(opts: QuantizeOptions) -> tuple[dict[str, np.ndarray] | None, IMatrix | None]:
    """llama-quantize's ``prepare_imatrix``: load, normalise, then --exclude/--include-weights (substring)."""
    if opts.imatrix is None:
        return None, None
    im = opts.imatrix if isinstance(opts.imatrix, IMatrix) else load_imatrix(opts.imatrix)
    if not im.is_legacy and not im.has_metadata and not isinstance(opts.imatrix, IMatrix):
        raise QuantizeError(f"missing imatrix metadata in file {str(opts.imatrix)!r}")
    if opts.include_weights and opts.exclude_weights:
        raise QuantizeError("--include-weights and --exclude-weights cannot be used together")
    data = im.for_quantize()
    for pat in opts.exclude_weights:
        data = {k: v for k, v in data.items() if pat not in k}
    if opts.include_weights:
        data = {k: v for k, v in data.items() if any(p in k for p in opts.include_weights)}
    for k, v in data.items():
        if not np.all(np.isfinite(v)):
            raise QuantizeError(f"imatrix contains non-finite values (entry {k})")
    return (data or None), im


def _kv_value(r: GGUFReader, key: str, overrides: dict[str, KVOverride], default: Any) -> Any:
    if key in overrides:
        return overrides[key].value
    if key not in r:
        return default
    v = r[key]
    if isinstance(v, np.ndarray | list | tuple):
        return int(v[0]) if len(v) else default
    return v


def model_info(r: GGUFReader, kv_overrides: Sequence[KVOverride] = ()) -> ModelInfo:
    """The hparams the type rules use, as llama.cpp's loader reads them (overrides applied)."""
    ov = {o.key: o for o in kv_overrides}
    if Keys.GENERAL_ARCHITECTURE not in r:
        raise QuantizeError(f"the input has no {Keys.GENERAL_ARCHITECTURE} key: not a llama.cpp model file")
    arch = str(_kv_value(r, Keys.GENERAL_ARCHITECTURE, ov, ""))
    n_layer = int(_kv_value(r, Keys.arch(Keys.BLOCK_COUNT, arch), ov, 0))
    n_head = int(_kv_value(r, Keys.arch(Keys.ATTENTION_HEAD_COUNT, arch), ov, 0))
    n_head_kv = int(_kv_value(r, Keys.arch(Keys.ATTENTION_HEAD_COUNT_KV, arch), ov, n_head))
    n_expert = int(_kv_value(r, Keys.arch(Keys.EXPERT_COUNT, arch), ov, 0))
    return ModelInfo.from_hparams(arch, n_layer, n_head, n_head_kv, n_expert)


_BLK = re.compile(r"blk\.(\d+)\.")


def _remap_layers(names: list[str], prune: list[int]) -> tuple[dict[str, str], dict[int, str], int]:
    """``remap_layer`` over the weights in order: new names ('' = pruned), the layer map, the new count."""
    out: dict[str, str] = {}
    mapped: dict[int, str] = {}
    next_id = 0
    for name in names:
        m = _BLK.search(name) if prune else None
        if m is None:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = ""
            elif blk < prune[0]:
                mapped[blk] = str(blk)
                next_id = blk + 1
            else:
                mapped[blk] = str(next_id)
                next_id += 1
        out[name] = name[: m.start(1)] + mapped[blk] + name[m.end(1):] if mapped[blk] else ""
    return out, mapped, next_id


def _remap_imatrix_name(name: str, mapped: dict[int, str]) -> str:
    if not mapped:
        return name
    m = _BLK.search(name)
    if m is None:
        return name
    for orig, new in sorted(mapped.items()):
        if new == m.group(1):
            return name[: m.start(1)] + str(orig) + name[m.end(1):]
    raise QuantizeError(f"imatrix mapping error for {name}")


def _rows_to_f32(raw: np.ndarray, ti: TensorInfo) -> np.ndarray:
    """Raw rows (n, row_bytes) as float32 rows (n, ne0), as ``llama_tensor_dequantize_impl``."""
    n = raw.shape[0]
    if ti.type == GGMLType.F32:
        return raw.view(np.float32).reshape(n, ti.ne[0])
    if ti.type == GGMLType.F16:
        return raw.view(np.float16).reshape(n, ti.ne[0]).astype(np.float32)
    if ti.type == GGMLType.BF16:
        return bf16_to_f32(np.ascontiguousarray(raw).view(np.uint16)).reshape(n, ti.ne[0])
    if ti.type.is_quantized:
        return quants.dequantize(np.ascontiguousarray(raw), ti.type)
    raise QuantizeError(f"cannot dequantize/convert tensor {ti.name} of type {ti.type.type_name}")


def _quantize_tensor(r: GGUFReader, ti: TensorInfo, new_type: GGMLType, imatrix: np.ndarray | None,
                     max_buf: int) -> Iterator[np.ndarray]:
    """``llama_tensor_quantize_impl`` in slabs of rows that fit ``max_buf`` bytes (source, float32 and
    result), never across an expert matrix (each has its own imatrix slice); each slab validated.

    Rows are independent, so any slab size gives the same bytes; the codecs spread a slab's rows over the
    threads (``quants.chunks.using_threads``).
    """
    n_per_row, rows_per_expert = ti.ne[0], ti.ne[1]
    n_rows = ti.nelements // n_per_row
    src = np.asarray(r.tensor_bytes(ti.name)).reshape(n_rows, -1)
    per_row = src.shape[1] + new_type.row_size(n_per_row) + (0 if ti.type == GGMLType.F32 else 4 * n_per_row)
    slab = max(1, min(n_rows, max_buf // per_row))
    for e0 in range(0, n_rows, rows_per_expert):
        e1 = min(n_rows, e0 + rows_per_expert)
        im = None if imatrix is None else imatrix[(e0 // rows_per_expert) * n_per_row:][:n_per_row]
        for r0 in range(e0, e1, slab):
            r1 = min(e1, r0 + slab)
            q = quants.quantize(np.ascontiguousarray(_rows_to_f32(src[r0:r1], ti)), new_type, im)
            if not quants.validate_row_data(new_type, q):
                raise QuantizeError(f"quantized data validation failed for {ti.name}")
            yield q


def _set_override(w: GGUFWriter, o: KVOverride) -> None:
    if o.tag == "float":
        w.set_f32(o.key, o.value)
    elif o.tag == "int":
        w.set_u32(o.key, abs(int(o.value)) & 0xFFFFFFFF)  # llama.cpp stores int overrides as u32 of |v|
    elif o.tag == "bool":
        w.set_bool(o.key, o.value)
    else:
        w.set_str(o.key, o.value)


def quantize_model(fname_inp: str | os.PathLike[str], fname_out: str | os.PathLike[str] | None,
                   ftype: str | int | LlamaFType, options: QuantizeOptions | None = None,
                   log: Callable[[str], None] | None = None) -> QuantizeResult:
    """Quantize a GGUF model to a llama.cpp file type (``llama_model_quantize`` + llama-quantize's options).

    ``ftype`` is a name (``"Q4_K_M"``, aliases and ``"COPY"`` included) or a number. Raises
    :class:`QuantizeError` for bad input (unknown type, requantizing without ``allow_requantize``,
    an IQ type without an imatrix, ...) before anything is written.
    """
    opts = options or QuantizeOptions()
    say = log or (lambda s: None)
    opt = parse_ftype(int(ftype) if isinstance(ftype, LlamaFType) else ftype)
    if not opts.dry_run:
        if fname_out is None:
            raise QuantizeError("no output file given")
        if Path(fname_out).exists() and Path(fname_inp).exists() and os.path.samefile(fname_inp, fname_out):
            raise QuantizeError(f"input and output files are the same: {str(fname_inp)!r}")
        parent = Path(fname_out).parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):  # fail before minutes of work, not after
            raise QuantizeError(f"cannot write {str(fname_out)!r}: {str(parent)!r} is not a writable directory")
    im_data, im = _imatrix_data(opts)
    try:
        r = GGUFReader(fname_inp)
    except GGUFError as e:
        raise QuantizeError(f"cannot read model {str(fname_inp)!r}: {e}") from None
    except OSError as e:
        raise QuantizeError(f"cannot read model {str(fname_inp)!r}: {e.strerror or e}") from None
    with r:
        return _quantize(r, fname_out, opt.ftype, opt.name == "COPY", opts, im_data, im, say)


def _quantize(r: GGUFReader, fname_out: Any, ftype: LlamaFType, only_copy: bool, opts: QuantizeOptions,
              im_data: dict[str, np.ndarray] | None, im: IMatrix | None, say: Callable[[str], None]) -> QuantizeResult:
    info = model_info(r, opts.kv_overrides)
    by_name = {ti.name: ti for ti in r.tensors}
    order = weight_order(list(by_name))
    out_ftype = int(ftype)
    if only_copy:
        out_ftype = int(r.get_u32(Keys.GENERAL_FILE_TYPE)) if Keys.GENERAL_FILE_TYPE in r else guess_ftype(
            [by_name[n].type for n in order])
    default_type = ftype_default_type(ftype)
    params = QuantParams(ftype=ftype, output_tensor_type=as_type_opt(opts.output_tensor_type),
                         token_embedding_type=as_type_opt(opts.token_embedding_type),
                         quantize_output_tensor=not opts.leave_output_tensor, only_copy=only_copy, pure=opts.pure,
                         tensor_types=list(opts.tensor_types))
    renamed, mapped, n_blocks = _remap_layers(order, sorted(set(opts.prune_layers)))
    kept = [n for n in order if renamed[n]]
    chooser = TypeChooser(info, params, [renamed[n] for n in kept], im_data is not None)

    w = GGUFWriter()
    for kv in r.kvs():
        w.set_kv(kv)
    # ggml's gguf_set_kv copies a general.alignment key but the new context keeps the default alignment
    # for its layout (and llama-quantize pads tensors to 32): so does this output
    w._set_alignment(GGUF_DEFAULT_ALIGNMENT)
    w.set_u32(Keys.GENERAL_QUANTIZATION_VERSION, GGML_QNT_VERSION)
    w.set_u32(Keys.GENERAL_FILE_TYPE, out_ftype & 0xFFFFFFFF)
    for k in (Keys.SPLIT_NO, Keys.SPLIT_COUNT, Keys.SPLIT_TENSORS_COUNT):
        w.remove_key(k)
    overrides = list(opts.kv_overrides)
    if im_data is not None and im is not None:
        src = str(opts.imatrix) if not isinstance(opts.imatrix, IMatrix) else ""
        overrides.append(KVOverride(Keys.QUANTIZE_IMATRIX_FILE, "str", src.encode()[:127].decode("utf-8", "ignore")))
        if im.datasets:
            overrides.append(KVOverride(Keys.QUANTIZE_IMATRIX_DATASET, "str",
                                        im.datasets[0].encode()[:127].decode("utf-8", "ignore")))
        overrides.append(KVOverride(Keys.QUANTIZE_IMATRIX_N_ENTRIES, "int", len(im_data)))
        if im.chunk_count > 0:
            overrides.append(KVOverride(Keys.QUANTIZE_IMATRIX_N_CHUNKS, "int", im.chunk_count))
    for o in overrides:
        _set_override(w, o)
    if opts.prune_layers:
        w.set_u32(Keys.arch(Keys.BLOCK_COUNT, info.arch), n_blocks)

    plans: list[TensorPlan] = []
    needs_imatrix = False
    for n in kept:
        ti = by_name[n]
        name = renamed[n]
        n_dims = 1 + max((i for i, d in enumerate(ti.ne) if d != 1), default=0)  # ggml_n_dims
        ok = allows_quantization(params, info.arch, name, n_dims)
        new_type = chooser.choose(name, ti.ne, ti.type, n_dims, default_type) if ok else ti.type
        req = requires_imatrix(name, new_type, ftype)
        plans.append(TensorPlan(ti, name, new_type, req, _remap_imatrix_name(name, mapped) if im_data else name))
        if ok and req and im_data is None:
            if not opts.dry_run:
                raise QuantizeError(
                    f"this quantization requires an importance matrix (--imatrix): tensor {name} would be "
                    f"{new_type.type_name}")
            needs_imatrix = True
    for line in chooser.fallbacks:
        say(f"warning: {line}")
    for p in plans:
        if p.new_type != p.src.type:
            if p.src.type.is_quantized and not opts.allow_requantize:
                raise QuantizeError(f"requantizing from type {p.src.type.type_name} is disabled "
                                    f"(tensor {p.name}; use --allow-requantize)")
            if im_data is not None and p.imatrix_name in im_data:
                size = len(im_data[p.imatrix_name])
                if size != p.src.ne[0] * p.src.ne[2] and not is_token_embd(p.name):
                    raise QuantizeError(f"imatrix size {size} is different from tensor size "
                                        f"{p.src.ne[0] * p.src.ne[2]} for {p.name}")
            if p.requires_imatrix and (im_data is None or p.imatrix_name not in im_data) and not opts.dry_run:
                raise QuantizeError(f"Missing importance matrix for tensor {p.name} in a very low-bit quantization")

    size_in = sum(p.src.nbytes for p in plans)
    size_out = sum(p.new_type.row_size(p.src.ne[0]) * (p.src.nelements // p.src.ne[0]) for p in plans)
    if opts.dry_run:
        for p in plans:
            say(f"{p.name:<36} - {p.src.type.type_name:>7} -> {p.new_type.type_name:>7}")
        if needs_imatrix:
            say("warning: dry run completed, but this quantization will require an imatrix")
        return QuantizeResult(plans, size_in, size_out, chooser.n_fallback, None)
    return _write(r, w, plans, im_data, opts, fname_out, size_in, size_out, chooser.n_fallback, say)


def _write(r: GGUFReader, w: GGUFWriter, plans: list[TensorPlan], im_data: dict[str, np.ndarray] | None,
           opts: QuantizeOptions, fname_out: Any, size_in: int, size_out: int, n_fallback: int,
           say: Callable[[str], None]) -> QuantizeResult:
    nthread = opts.nthread if opts.nthread > 0 else (os.cpu_count() or 1)
    bar = None
    if opts.progress:
        bar = tqdm(total=len(plans), desc="quantizing", unit="tensor", file=sys.stderr, leave=False)

    def producer(p: TensorPlan) -> Callable[[], Iterator[np.ndarray]]:
        def data() -> Iterator[np.ndarray]:  # run by the writer when it reaches this tensor
            if bar is not None:
                bar.set_postfix_str(f"{p.name} -> {p.new_type.type_name}", refresh=False)
            if p.new_type == p.src.type:
                yield np.asarray(r.tensor_bytes(p.src.name))
            else:
                imatrix = None
                if im_data is not None:
                    v = im_data.get(p.imatrix_name)
                    if v is not None and len(v) == p.src.ne[0] * p.src.ne[2]:
                        imatrix = v
                    elif v is None:
                        say(f"did not find weights for {p.name}")
                yield from _quantize_tensor(r, p.src, p.new_type, imatrix, opts.max_buffer_size)
            if opts.verbose:
                say(f"{p.name:<36} - [{', '.join(str(d) for d in p.src.ne)}], type = {p.src.type.type_name:>6}"
                    f" -> {p.new_type.type_name}")
            if bar is not None:
                bar.update(1)
        return data

    for p in plans:
        w.add_tensor(p.name, producer(p), type=p.new_type, ne=p.src.ne)
    try:
        with chunks.using_threads(nthread):
            path = w.write(fname_out)
    finally:
        if bar is not None:
            bar.close()
    say(f"model size = {size_in / 2**20:8.2f} MiB, quant size = {size_out / 2**20:8.2f} MiB")
    if n_fallback:
        say(f"warning: {n_fallback} of {len(plans)} tensor(s) required fallback quantization")
    return QuantizeResult(plans, size_in, size_out, n_fallback, path)
