"""The type-choice rules against llama.cpp's own snapshots (tests/snapshots/*.schema, test-quant-type-selection).

Each snapshot lists, per file type, the tensors of a real model whose type differs from the file type's
default, as ``llama_quant_compute_types`` picks them (no imatrix). The models' tensors are rebuilt here
from the header's hparams (dense transformers: q/k/v/o, gate/up/down, token embeddings, output unless
tied; 3-d expert tensors for MoE), which covers the 70B rule, GQA bumps, use_more_bits over 28 to 80
layers, tied embeddings, fallbacks for rows of 2880, MXFP4_MOE and expert layer parsing (gpt-oss), and
DeepSeek-V3.1 (MLA, 3-d attn_k_b/attn_v_b, dense + expert + shared-expert layers).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.data import data_path
from pyggml.quantize.ftypes import ftype_default_type, parse_ftype
from pyggml.quantize.rules import ModelInfo, QuantParams, TypeChooser, allows_quantization, weight_order
from pyggml.types import GGMLType

SNAP = data_path("quantize", "snapshots")

#: file -> (arch, head_dim, tied output)
MODELS = {
    "qwen3-0.6b.schema": ("qwen3", 128, False),
    "qwen3-14b.schema": ("qwen3", 128, False),
    "meta-llama-3.1-70b-instruct.schema": ("llama", 128, False),
    "gemma-3-4b-it.schema": ("gemma3", 256, True),
    "gpt-oss-120b.schema": ("gpt-oss", 64, False),  # MoE: 128 experts in 3-d tensors, rows of 2880
    "deepseek-v3.1.schema": ("deepseek2", 0, False),  # MLA + 256 experts + shared experts, 3 dense layers
}


def parse(path: Path) -> tuple[dict[str, int], dict[str, tuple[str, dict[str, str]]]]:
    hp: dict[str, int] = {}
    sections: dict[str, tuple[str, dict[str, str]]] = {}
    cur: dict[str, str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("# n_embd"):
            hp = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        elif line.startswith("["):
            name, default = re.match(r"\[(\w+)\] (\w+)", line).groups()
            cur = {}
            sections[name] = (default, cur)
        elif line and not line.startswith("#") and cur is not None:
            t, ty = line.split()
            cur[t] = ty
    return hp, sections


def deepseek_tensors(hp: dict[str, int]) -> dict[str, tuple[int, int, int, int]]:
    """DeepSeek-V3 as llama.cpp's converter writes it (config: q_lora 1536, kv_lora 512, nope 128, rope 64,
    v 128, moe_intermediate 2048, first 3 layers dense; attn_k_b / attn_v_b split per head, 3-d)."""
    e, nh, ne_, voc = hp["n_embd"], hp["n_head"], hp["n_expert"], hp["n_vocab"]
    out = {"token_embd.weight": (e, voc, 1, 1), "output.weight": (e, voc, 1, 1)}
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        out.update({p + "attn_q_a.weight": (e, 1536, 1, 1), p + "attn_q_b.weight": (1536, nh * 192, 1, 1),
                    p + "attn_kv_a_mqa.weight": (e, 576, 1, 1), p + "attn_k_b.weight": (128, 512, nh, 1),
                    p + "attn_v_b.weight": (512, 128, nh, 1), p + "attn_output.weight": (nh * 128, e, 1, 1)})
        if i < 3:
            out.update({p + "ffn_gate.weight": (e, hp["n_ff"], 1, 1), p + "ffn_up.weight": (e, hp["n_ff"], 1, 1),
                        p + "ffn_down.weight": (hp["n_ff"], e, 1, 1)})
        else:
            out.update({p + "ffn_gate_inp.weight": (e, ne_, 1, 1), p + "ffn_gate_exps.weight": (e, 2048, ne_, 1),
                        p + "ffn_up_exps.weight": (e, 2048, ne_, 1), p + "ffn_down_exps.weight": (2048, e, ne_, 1),
                        p + "ffn_gate_shexp.weight": (e, 2048, 1, 1), p + "ffn_up_shexp.weight": (e, 2048, 1, 1),
                        p + "ffn_down_shexp.weight": (2048, e, 1, 1)})
    return out


def tensors(hp: dict[str, int], head_dim: int, tied: bool) -> dict[str, tuple[int, int, int, int]]:
    e, ff, nh, nkv, nx = hp["n_embd"], hp["n_ff"], hp["n_head"], hp["n_head_kv"], hp.get("n_expert", 0)
    out = {"token_embd.weight": (e, hp["n_vocab"], 1, 1)}
    if not tied:
        out["output.weight"] = (e, hp["n_vocab"], 1, 1)
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        out.update({p + "attn_q.weight": (e, nh * head_dim, 1, 1), p + "attn_k.weight": (e, nkv * head_dim, 1, 1),
                    p + "attn_v.weight": (e, nkv * head_dim, 1, 1),
                    p + "attn_output.weight": (nh * head_dim, e, 1, 1), p + "attn_norm.weight": (e, 1, 1, 1)})
        if nx:
            out.update({p + "ffn_gate_exps.weight": (e, ff, nx, 1), p + "ffn_up_exps.weight": (e, ff, nx, 1),
                        p + "ffn_down_exps.weight": (ff, e, nx, 1), p + "ffn_gate_inp.weight": (e, nx, 1, 1)})
        else:
            out.update({p + "ffn_gate.weight": (e, ff, 1, 1), p + "ffn_up.weight": (e, ff, 1, 1),
                        p + "ffn_down.weight": (ff, e, 1, 1)})
    return out


@pytest.mark.parametrize("fname", list(MODELS))
def test_type_choice_matches_llama_cpp_snapshots(fname: str) -> None:
    arch, head_dim, tied = MODELS[fname]
    hp, sections = parse(SNAP / fname)
    ts = deepseek_tensors(hp) if arch == "deepseek2" else tensors(hp, head_dim, tied)
    info = ModelInfo.from_hparams(arch, hp["n_layer"], hp["n_head"], hp["n_head_kv"], hp.get("n_expert", 0))
    checked = 0
    for section, (default_name, expected) in sections.items():
        opt = parse_ftype(section)
        default = ftype_default_type(opt.ftype)
        assert default.type_name == default_name, section
        params = QuantParams(ftype=opt.ftype)
        dims = {n: 1 + max(i for i, d in enumerate(ne) if d != 1 or i == 0) for n, ne in ts.items()}
        names = [n for n in weight_order(list(ts)) if allows_quantization(params, arch, n, dims[n])]
        chooser = TypeChooser(info, params, names, has_imatrix=False)
        got = {}
        for n in names:
            ty = chooser.choose(n, ts[n], GGMLType.F32, dims[n], default)
            if ty != default:
                got[n] = ty.type_name
        assert got == expected, f"{fname} [{section}]: {sorted(set(got.items()) ^ set(expected.items()))[:6]}"
        checked += 1
    assert checked >= 30
