"""Write a random-weight mixture-of-experts model (qwen3moe) and its dense equivalent (qwen3 whose FFN
is as wide as the experts a token uses), for speed comparisons of the MoE FFN.

    python bench/moe_model.py OUT_DIR [--n-embd 1024 --n-layer 12 --n-expert 8 --n-used 2 --n-ff-exp 768 --type q8_0]
    python -P bench/vs_llamacpp.py --llama-bench .../llama-bench -m OUT_DIR/moe.gguf -m OUT_DIR/dense.gguf \\
        -p 128 -n 64 -r 2 -t 2 --rounds 2

The two files have the same attention and the same active FFN parameters per token: a decode step of
the MoE should cost about what the dense one costs (only the chosen experts' rows are read), plus the
router. Weights are gaussian, quantized by pyggml (bit for bit ggml's quantizer); the vocabulary is
the 256 bytes, enough for llama-bench and ``pyggml bench``, which feed token ids.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pyggml import quants
from pyggml.gguf import GGUFWriter
from pyggml.llm.tokenizer.unicode import BYTE_TO_CHAR
from pyggml.types import GGMLType


def _tokens() -> list[str]:
    """The 256 byte-level tokens of GPT-2's map, the last one replaced by a merged token (a merge list
    may not be empty)."""
    return [*BYTE_TO_CHAR[:-1], "ĠĠ"]


def write(path: Path, moe: bool, n_embd: int, n_layer: int, n_expert: int, n_used: int, n_ff_exp: int,
          qtype: str, seed: int = 0) -> Path:
    arch = "qwen3moe" if moe else "qwen3"
    rng = np.random.default_rng(seed)
    t = GGMLType[qtype.upper()]
    head, n_head, n_head_kv, n_vocab = 128, n_embd // 128, max(n_embd // 512, 1), 256
    w = GGUFWriter()
    w.set_str("general.architecture", arch)
    w.set_str("general.name", f"random {arch} ({'MoE' if moe else 'dense'} speed model)")
    for key, v in (("context_length", 4096), ("embedding_length", n_embd), ("block_count", n_layer),
                   ("attention.head_count", n_head), ("attention.head_count_kv", n_head_kv),
                   ("attention.key_length", head), ("attention.value_length", head),
                   ("feed_forward_length", n_ff_exp * (1 if moe else n_used))):
        w.set_u32(f"{arch}.{key}", v)
    w.set_f32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.set_f32(f"{arch}.rope.freq_base", 1000000.0)
    if moe:
        w.set_u32(f"{arch}.expert_count", n_expert)
        w.set_u32(f"{arch}.expert_used_count", n_used)
        w.set_u32(f"{arch}.expert_feed_forward_length", n_ff_exp)
    w.set_str("tokenizer.ggml.model", "gpt2")
    w.set_str("tokenizer.ggml.pre", "default")
    w.set_arr("tokenizer.ggml.tokens", _tokens())
    w.set_arr("tokenizer.ggml.token_type", [1] * n_vocab)
    w.set_arr("tokenizer.ggml.merges", ["Ġ Ġ"])
    w.set_u32("tokenizer.ggml.bos_token_id", 0)
    w.set_u32("tokenizer.ggml.eos_token_id", 1)

    def weight(name: str, *ne: int, quantize: bool = True) -> None:
        x = (0.02 * rng.standard_normal(tuple(reversed(ne)), dtype=np.float32))
        if not quantize:
            w.add_tensor(name, x)
            return
        rows = x.reshape(-1, ne[0])
        w.add_tensor(name, quants.quantize(rows, qtype).reshape(*reversed(ne[1:]), -1), type=t, ne=ne)

    weight("token_embd.weight", n_embd, n_vocab)
    weight("output_norm.weight", n_embd, quantize=False)
    weight("output.weight", n_embd, n_vocab)
    q, kv = n_head * head, n_head_kv * head
    for il in range(n_layer):
        p = f"blk.{il}."
        for name, ne in (("attn_q", (n_embd, q)), ("attn_k", (n_embd, kv)), ("attn_v", (n_embd, kv)),
                         ("attn_output", (q, n_embd))):
            weight(p + name + ".weight", *ne)
        for name, n in (("attn_norm", n_embd), ("ffn_norm", n_embd), ("attn_q_norm", head), ("attn_k_norm", head)):
            weight(p + name + ".weight", n, quantize=False)
        if moe:
            weight(p + "ffn_gate_inp.weight", n_embd, n_expert, quantize=False)
            weight(p + "ffn_gate_exps.weight", n_embd, n_ff_exp, n_expert)
            weight(p + "ffn_up_exps.weight", n_embd, n_ff_exp, n_expert)
            weight(p + "ffn_down_exps.weight", n_ff_exp, n_embd, n_expert)
        else:
            n_ff = n_ff_exp * n_used
            weight(p + "ffn_gate.weight", n_embd, n_ff)
            weight(p + "ffn_up.weight", n_embd, n_ff)
            weight(p + "ffn_down.weight", n_ff, n_embd)
    w.write(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for moe.gguf and dense.gguf")
    ap.add_argument("--n-embd", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-expert", type=int, default=8)
    ap.add_argument("--n-used", type=int, default=2)
    ap.add_argument("--n-ff-exp", type=int, default=768)
    ap.add_argument("--type", default="q8_0", help="ggml type of the matrices (default q8_0)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for moe, name in ((True, "moe.gguf"), (False, "dense.gguf")):
        path = write(a.out / name, moe, a.n_embd, a.n_layer, a.n_expert, a.n_used, a.n_ff_exp, a.type)
        print(f"{path}: {path.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
