"""Tiny random Hugging Face models (the architectures pyggml's converter takes) and their conversion to
GGUF by pyggml.

Needs torch and transformers: a test module imports this after ``pytest.importorskip`` of both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from pyggml.llm.convert import convert_hf_model

CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM"),
}


def build(arch: str, hidden: int = 64, inter: int = 128, vocab: int = 512, std: float = 0.08, seed: int = 0,
          **extra: Any) -> tuple[Any, Any]:
    """A random model: 2 layers, 4 heads, 2 KV heads; norms near 1 (Gemma: near 0, it adds 1), random biases."""
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[arch])
    kw: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              attn_implementation="eager")
    if arch == "gemma3":
        kw.update(head_dim=hidden // 4, query_pre_attn_scalar=hidden // 4, sliding_window=8,
                  layer_types=["sliding_attention", "full_attention"])
    elif arch in ("gemma", "gemma2"):
        kw.update(head_dim=hidden // 4, query_pre_attn_scalar=hidden // 4, sliding_window=8)
    kw.update(extra)
    torch.manual_seed(seed)
    config = cfg_cls(**kw)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if arch.startswith("gemma") else 1.0) + 0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, std)
    return model, config


def convert(tmp_path: Path, model: Any, config: Any, ftype: str = "f32", **kw: Any) -> Path:
    return convert_hf_model(model, config, tmp_path / f"model-{ftype}.gguf", ftype, **kw)
