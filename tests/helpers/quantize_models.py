"""Small deterministic models for the quantize / imatrix tests (and the script that makes them).

Weights come from numpy's PCG64 (stable across platforms and numpy versions), laid out as a
transformers ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` state dict, and are written by
``pyggml.llm.convert.convert_hf_model``. The shapes exercise llama_tensor_get_type's rules: rows
that are and are not multiples of 256 (and of 32), 8 layers (so ``n_layer/8`` and ``use_more_bits``
bump some layers) and 3, GQA 4, 2 and 1, tied and untied output, F32, F16 and BF16 inputs.

    python tests/helpers/quantize_models.py OUT_DIR     # writes every model (see tests/data/quantize/README.md)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.llm.convert import convert_hf_model


@dataclass(frozen=True)
class Spec:
    arch: str
    hidden: int
    inter: int
    n_layer: int
    n_head: int
    n_kv: int
    vocab: int
    tied: bool
    ftype: str
    seed: int
    head_dim: int | None = None


SPECS: dict[str, Spec] = {
    # every row a multiple of 256; GQA 4; 8 layers; untied output
    "llama8": Spec("llama", 256, 256, 8, 4, 1, 160, False, "f32", 1),
    # rows of 160 (a multiple of 32, not of 256) and 200 (not even of 32: F16 fallback); tied; GQA 1
    "qwen3odd": Spec("qwen2", 160, 200, 3, 5, 5, 96, True, "f32", 2),
    # F16 input, rows of 256 and 768, 2 layers, tied, GQA 2
    "llama2f16": Spec("llama", 256, 768, 2, 4, 2, 128, True, "f16", 3),
    # BF16 input (the same shapes as llama2f16, other weights)
    "llama2bf16": Spec("llama", 256, 768, 2, 4, 2, 128, True, "bf16", 4),
}


def state_dict(s: Spec) -> tuple[dict[str, np.ndarray], dict]:
    rng = np.random.default_rng(s.seed)
    hd = s.head_dim or s.hidden // s.n_head

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 0.05, (rows, cols)).astype(np.float32)

    def vec(n: int, mean: float = 0.0) -> np.ndarray:
        return (mean + 0.1 * rng.standard_normal(n)).astype(np.float32)

    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(s.vocab, s.hidden)}
    for i in range(s.n_layer):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = vec(s.hidden, 1.0)
        sd[p + "self_attn.q_proj.weight"] = mat(s.n_head * hd, s.hidden)
        sd[p + "self_attn.k_proj.weight"] = mat(s.n_kv * hd, s.hidden)
        sd[p + "self_attn.v_proj.weight"] = mat(s.n_kv * hd, s.hidden)
        if s.arch == "qwen2":
            sd[p + "self_attn.q_proj.bias"] = vec(s.n_head * hd)
            sd[p + "self_attn.k_proj.bias"] = vec(s.n_kv * hd)
            sd[p + "self_attn.v_proj.bias"] = vec(s.n_kv * hd)
        sd[p + "self_attn.o_proj.weight"] = mat(s.hidden, s.n_head * hd)
        sd[p + "post_attention_layernorm.weight"] = vec(s.hidden, 1.0)
        sd[p + "mlp.gate_proj.weight"] = mat(s.inter, s.hidden)
        sd[p + "mlp.up_proj.weight"] = mat(s.inter, s.hidden)
        sd[p + "mlp.down_proj.weight"] = mat(s.hidden, s.inter)
    sd["model.norm.weight"] = vec(s.hidden, 1.0)
    if not s.tied:
        sd["lm_head.weight"] = mat(s.vocab, s.hidden)
    config = {
        "architectures": ["LlamaForCausalLM" if s.arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": s.arch, "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.inter,
        "num_hidden_layers": s.n_layer, "num_attention_heads": s.n_head, "num_key_value_heads": s.n_kv,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": s.tied,
    }
    return sd, config


def make_model(name: str, out_dir: Path, tokenizer: object = None) -> Path:
    """Write model ``name`` of :data:`SPECS` to ``out_dir/NAME.gguf``."""
    s = SPECS[name]
    sd, config = state_dict(s)
    return convert_hf_model(sd, config, Path(out_dir) / f"{name}.gguf", s.ftype, tokenizer=tokenizer,
                            arch=s.arch, name=name)


def make_imatrix(model: Path, out: Path, seed: int = 7) -> Path:
    """A deterministic synthetic imatrix (GGUF) for every 2-d weight of ``model``: positive sums, varied counts."""
    from pyggml.gguf import GGUFReader
    from pyggml.quantize import IMatrix, IMatrixEntry, save_imatrix

    rng = np.random.default_rng(seed)
    im = IMatrix(datasets=["synthetic.txt"], chunk_count=3, chunk_size=64, has_metadata=True)
    with GGUFReader(model) as r:
        for ti in r.tensors:
            if ti.n_dims >= 2 and ti.name.startswith("blk."):
                n = 3 * 64
                sums = (rng.gamma(2.0, 1.0, ti.ne[0]) * n).astype(np.float32)
                im.entries[ti.name] = IMatrixEntry(sums, np.array([n], dtype=np.int64))
    return save_imatrix(im, out)


def make_models(out_dir: Path) -> dict[str, tuple[Path, Path]]:
    """Every test model and its imatrix: name -> (model path, imatrix path)."""
    out: dict[str, tuple[Path, Path]] = {}
    for n in SPECS:
        path = make_model(n, out_dir)
        out[n] = (path, make_imatrix(path, out_dir / f"{n}.imatrix.gguf"))
    out["moe2"] = (make_moe_model(out_dir / "moe2.gguf"), make_moe_imatrix(out_dir / "moe2.imatrix.gguf"))
    return out




def make_tokenized_model(out: Path) -> Path:
    """A 2-layer F32 llama with a trained byte-level BPE tokenizer (BOS added), for llama-imatrix comparisons."""
    from tokenizers import processors

    from helpers.bpe_build import train

    tok = train("llama3", 300).hf
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    s = Spec("llama", 64, 128, 2, 4, 2, tok.get_vocab_size(with_added_tokens=True), True, "f32", 5)
    sd, config = state_dict(s)
    return convert_hf_model(sd, config, out, "f32", tokenizer=tok, arch="llama", name="tok2",
                            special_token_ids={"bos": bos})


def make_moe_model(out: Path, seed: int = 6) -> Path:
    """A 2-layer llama-architecture MoE (4 experts, 2 used) written directly: 3-d ``ffn_*_exps`` tensors
    (rows of 256 and 512), the router ``ffn_gate_inp``, F16 attention from :func:`state_dict`."""
    from pyggml.gguf import GGUFWriter

    s = Spec("llama", 256, 512, 2, 4, 2, 128, False, "f16", seed)
    sd, _ = state_dict(s)
    rng = np.random.default_rng(seed)
    n_exp = 4
    w = GGUFWriter()
    md = {"general.architecture": "llama", "general.name": "moe2", "llama.block_count": 2,
          "llama.context_length": 256, "llama.embedding_length": 256, "llama.feed_forward_length": 512,
          "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.rope.freq_base": 10000.0,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.expert_count": n_exp, "llama.expert_used_count": 2,
          "llama.vocab_size": 128, "llama.rope.dimension_count": 64, "general.file_type": 1}
    for k, v in md.items():
        if isinstance(v, str):
            w.set_str(k, v)
        elif isinstance(v, float):
            w.set_f32(k, v)
        else:
            w.set_u32(k, v)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].astype(np.float16))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"].astype(np.float16))
    for i in range(2):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        w.add_tensor(p + "attn_norm.weight", sd[h + "input_layernorm.weight"])
        for g, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            w.add_tensor(p + g + ".weight", sd[h + f"self_attn.{hf}.weight"].astype(np.float16))
        w.add_tensor(p + "ffn_norm.weight", sd[h + "post_attention_layernorm.weight"])
        w.add_tensor(p + "ffn_gate_inp.weight", rng.normal(0, 0.05, (n_exp, 256)).astype(np.float32))
        for g, shape in (("ffn_gate_exps", (n_exp, 512, 256)), ("ffn_up_exps", (n_exp, 512, 256)),
                         ("ffn_down_exps", (n_exp, 256, 512))):
            w.add_tensor(p + g + ".weight", rng.normal(0, 0.05, shape).astype(np.float16))
    return w.write(out)


def make_moe_imatrix(out: Path, seed: int = 8) -> Path:
    """A synthetic imatrix for :func:`make_moe_model`: per-expert sums and counts for the expert tensors."""
    from pyggml.quantize import IMatrix, IMatrixEntry, save_imatrix

    rng = np.random.default_rng(seed)
    im = IMatrix(datasets=["synthetic.txt"], chunk_count=2, chunk_size=64, has_metadata=True)
    for i in range(2):
        for name, cols, n_mat in (("attn_q", 256, 1), ("attn_k", 256, 1), ("attn_v", 256, 1),
                                  ("attn_output", 256, 1), ("ffn_gate_exps", 256, 4), ("ffn_up_exps", 256, 4),
                                  ("ffn_down_exps", 512, 4)):
            counts = rng.integers(1, 128, n_mat) if n_mat > 1 else np.array([128])
            sums = (rng.gamma(2.0, 1.0, cols * n_mat).reshape(n_mat, cols) * counts[:, None]).astype(np.float32)
            im.entries[f"blk.{i}.{name}.weight"] = IMatrixEntry(sums.reshape(-1), counts.astype(np.int64))
    return save_imatrix(im, out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers.bpe_build
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, _ in make_models(out_dir).values():
        print(path)
