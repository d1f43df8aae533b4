"""Hugging Face causal LMs -> GGUF, as llama.cpp's convert_hf_to_gguf.py writes them.

``convert_hf_model(model, config, "out.gguf", ftype="q8_0", tokenizer=tok)`` takes a transformers
model (or its state dict: torch tensors or numpy arrays) and config (object or dict), maps names and
shapes as llama.cpp does (a torch ``[out, in]`` matrix keeps its C-order bytes and becomes ggml
``ne = [in, out]``), applies the per-architecture fixes (arch.py), and writes the weights in the
chosen type. As in llama.cpp, 1-d tensors and norms always stay F32; 2-d weights take the output
type, and a weight whose rows do not fill whole blocks of it falls back the way llama-quantize falls
back (K-quants to a legacy type, then F16). ``q4_k`` etc. quantize every 2-d weight to that one type
(llama-quantize's ``--pure``), which keeps quality comparisons about one type at a time.

Command line: ``python -m pyggml.llm.convert MODEL_DIR -o OUT.gguf --outtype q8_0`` (needs transformers).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...gguf import GGUFValueType, GGUFWriter
from ...gguf.constants import Keys
from ...tensor_data import f32_to_rows
from ...types import GGMLType
from .arch import detect_arch, hparams_metadata, map_tensors, required_tensors, spec_of
from .vocab import ConversionError, tokenizer_metadata

#: output type name -> (tensor type of 2-d weights, llama_ftype written as general.file_type)
FTYPES: dict[str, tuple[GGMLType, int]] = {
    "f32": (GGMLType.F32, 0),
    "f16": (GGMLType.F16, 1),
    "bf16": (GGMLType.BF16, 32),
    "q4_0": (GGMLType.Q4_0, 2),
    "q4_1": (GGMLType.Q4_1, 3),
    "q8_0": (GGMLType.Q8_0, 7),
    "q5_0": (GGMLType.Q5_0, 8),
    "q5_1": (GGMLType.Q5_1, 9),
    "q4_k": (GGMLType.Q4_K, 15),
    "q5_k": (GGMLType.Q5_K, 17),
    "q6_k": (GGMLType.Q6_K, 18),
}
# llama-quantize's fallback for rows that are not whole super-blocks (llama_tensor_get_type)
_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}
GGML_QUANT_VERSION = 2

__all__ = ["FTYPES", "ConversionError", "convert_hf_model", "main", "tensor_type"]


def tensor_type(name: str, shape: tuple[int, ...], wanted: GGMLType) -> GGMLType:
    """The type a tensor is stored in: F32 for 1-d tensors and norms, else ``wanted`` or its fallback."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or name == "rope_freqs.weight":
        return GGMLType.F32
    ty = wanted
    if shape[-1] % ty.blck_size:
        ty = _FALLBACK.get(ty, GGMLType.F16)
    if shape[-1] % ty.blck_size:
        ty = GGMLType.F16
    return ty


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        raise ConversionError(f"config must be a dict or a transformers config, got {type(config).__name__}")
    return to_dict()


def _as_f32(name: str, value: Any) -> np.ndarray:
    """A state-dict value as float32 numpy, without importing torch (tensors know how to convert)."""
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        raise ConversionError(f"tensor {name!r} has non-numeric dtype {arr.dtype}")
    return arr.astype(np.float32, copy=False)


def _state_items(model_or_state_dict: Any) -> Iterator[tuple[str, np.ndarray]]:
    sd = model_or_state_dict.state_dict() if hasattr(model_or_state_dict, "state_dict") else model_or_state_dict
    if not isinstance(sd, Mapping):
        raise ConversionError(f"expected a model or a state dict, got {type(model_or_state_dict).__name__}")
    for name, value in sd.items():
        yield name, _as_f32(name, value)


def _put(w: GGUFWriter, key: str, value: Any) -> None:
    """Set a key with the value type llama.cpp's gguf writer uses for it."""
    if isinstance(value, bool):
        w.set_bool(key, value)
    elif isinstance(value, int):
        w.set_u32(key, value) if 0 <= value < 2**32 else w.set_i64(key, value)
    elif isinstance(value, float):
        w.set_f32(key, value)
    elif isinstance(value, str):
        w.set_str(key, value)
    elif value and isinstance(value[0], str):
        w.set_arr(key, list(value), GGUFValueType.STRING)
    elif value and isinstance(value[0], bool):
        w.set_arr(key, list(value), GGUFValueType.BOOL)
    else:
        w.set_arr(key, list(value), GGUFValueType.INT32)


def convert_hf_model(
    model_or_state_dict: Any,
    config: Any,
    out_path: str | os.PathLike[str],
    ftype: str = "f32",
    tokenizer: Any = None,
    *,
    arch: str | None = None,
    name: str | None = None,
    tokenizer_pre: str | None = None,
    special_token_ids: dict[str, int] | None = None,
) -> Path:
    """Write ``model_or_state_dict`` as a GGUF file at ``out_path``; returns the path.

    ``tokenizer`` (a ``tokenizers.Tokenizer`` or fast transformers tokenizer, BPE only) adds the
    ``tokenizer.ggml.*`` keys; ``tokenizer_pre`` overrides the pre-tokenizer name and
    ``special_token_ids`` the bos/eos/... ids. ``arch`` overrides architecture detection.
    """
    key = ftype.lower()
    if key not in FTYPES:
        raise ConversionError(f"unknown output type {ftype!r} (known: {', '.join(FTYPES)})")
    wanted, file_type = FTYPES[key]
    cfg = _config_dict(config)
    if arch is None:
        arch = detect_arch(model_or_state_dict, cfg)
    else:
        spec_of(arch)  # an unknown name is refused here
    w = GGUFWriter()
    w.set_str(Keys.GENERAL_ARCHITECTURE, arch)
    if name:
        w.set_str(Keys.GENERAL_NAME, name)
    for k, v in hparams_metadata(arch, cfg).items():
        _put(w, k, v)
    w.set_u32(Keys.GENERAL_QUANTIZATION_VERSION, GGML_QUANT_VERSION)
    w.set_u32(Keys.GENERAL_FILE_TYPE, file_type)
    n_vocab_real = None
    if tokenizer is not None:
        md = tokenizer_metadata(tokenizer, arch, int(cfg.get("vocab_size") or 0), tokenizer_pre, special_token_ids)
        if spec_of(arch).trim_vocab:  # gemma3's converter cuts the vocabulary (and embeddings) to the real tokens
            n_vocab_real = sum(1 for t in md[Keys.TOKENIZER_LIST] if not t.startswith("[PAD"))
            md[Keys.TOKENIZER_LIST] = md[Keys.TOKENIZER_LIST][:n_vocab_real]
            md[Keys.TOKENIZER_TOKEN_TYPE] = md[Keys.TOKENIZER_TOKEN_TYPE][:n_vocab_real]
        for k, v in md.items():
            _put(w, k, v)
    written: set[str] = set()
    for t in map_tensors(arch, cfg, _state_items(model_or_state_dict), n_vocab_real):
        ty = tensor_type(t.name, t.data.shape, wanted)
        ne = list(reversed(t.data.shape))
        w.add_tensor(t.name, lambda d=t.data, ty=ty: f32_to_rows(d, ty), type=ty, ne=ne)
        written.add(t.name)
    missing = [n for n in required_tensors(arch, cfg) if n not in written]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ConversionError(f"{arch}: the model lacks {', '.join(missing[:3])}{more}")
    return w.write(out_path)


def main(argv: list[str] | None = None) -> int:
    """``python -m pyggml.llm.convert MODEL_DIR``: convert a local HF model directory (never downloads)."""
    ap = argparse.ArgumentParser(prog="python -m pyggml.llm.convert", description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, help="directory with config.json and the weights")
    ap.add_argument("-o", "--outfile", type=Path, help="output GGUF (default: MODEL_DIR/model-OUTTYPE.gguf)")
    ap.add_argument("--outtype", default="f16", choices=sorted(FTYPES))
    args = ap.parse_args(argv)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        print("error: converting a model directory needs transformers (pip install transformers torch)",
              file=sys.stderr)
        return 1
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json", file=sys.stderr)
        return 1
    config = AutoConfig.from_pretrained(args.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, local_files_only=True, dtype="float32")
    tokenizer = None
    if (args.model_dir / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir, local_files_only=True)
    out = args.outfile or args.model_dir / f"model-{args.outtype}.gguf"
    try:
        path = convert_hf_model(model, config, out, args.outtype, tokenizer, name=args.model_dir.name)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
