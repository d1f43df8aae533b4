"""Tiny random HF Llama / Qwen2 / Gemma3 models, converted to GGUF by pyggml, against transformers' logits.

Each test builds a model from a config (random weights, float32, eager attention), converts it with
``pyggml.llm.convert``, decodes a token sequence with pyggml's runner and compares every position's
logits with transformers' forward pass. Weights are drawn larger than HF's init (std 0.08) for the F32
checks so attention is far from uniform and RoPE or head-layout mistakes show in the logits; the
sensitivity tests prove that. Quantized files are compared twice: with transformers run on the
dequantized weights (only pyggml's own error remains, so the bound is tight) and with the original
model (the quantization error, a loose bound).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, processors  # noqa: E402

from helpers.bpe_build import train  # noqa: E402
from helpers.hf_models import build, convert  # noqa: E402
from pyggml import quants  # noqa: E402
from pyggml.errors import PyGGMLError  # noqa: E402
from pyggml.gguf import GGUFReader  # noqa: E402
from pyggml.llm.context import ContextParams, LlamaContext  # noqa: E402
from pyggml.llm.convert import FTYPES, ConversionError, convert_hf_model, main, tensor_type  # noqa: E402
from pyggml.llm.convert import arch as convert_arch  # noqa: E402
from pyggml.llm.generate import generate  # noqa: E402
from pyggml.llm.model import Model  # noqa: E402
from pyggml.llm.sampling import Sampler, SamplingParams  # noqa: E402
from pyggml.llm.tokenizer import Vocab  # noqa: E402
from pyggml.types import GGMLType  # noqa: E402

N_TOKENS = 24
def tokens_for(vocab: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, N_TOKENS).tolist()


def hf_logits(model: Any, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def run(path: Path, tokens: list[int], n_ubatch: int = 512, one_by_one: bool = False, **params: Any) -> np.ndarray:
    ctx = LlamaContext(Model(path, progress=False), ContextParams(n_ctx=64, n_ubatch=n_ubatch, n_threads=2, **params))
    if one_by_one:
        return np.concatenate([ctx.decode([t]) for t in tokens])
    return ctx.decode(tokens, outputs=[True] * len(tokens))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ---------------------------------------------------------------------------------------------- F32


@pytest.mark.parametrize(
    ("arch", "extra"),
    [
        ("llama", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
        ("qwen2", {}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("gemma3", {"final_logit_softcapping": 30.0}),
        ("qwen3", {"head_dim": 16}),
        ("olmo2", {}),
        ("granite", {"embedding_multiplier": 6.0, "residual_multiplier": 0.4, "attention_multiplier": 0.5,
                     "logits_scaling": 2.5}),
        ("smollm3", {"num_hidden_layers": 4, "pad_token_id": None}),
        ("gemma", {}),
        ("gemma2", {"attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0}),
        ("starcoder2", {"bos_token_id": None, "eos_token_id": None}),
    ],
    ids=["llama", "llama-bias-tied", "qwen2", "qwen2-tied", "gemma3", "qwen3", "olmo2", "granite", "smollm3", "gemma",
         "gemma2", "starcoder2"],
)
def test_f32_logits_match_transformers(tmp_path: Path, arch: str, extra: dict[str, Any]) -> None:
    model, config = build(arch, **extra)
    toks = tokens_for(config.vocab_size)
    ref = hf_logits(model, toks)
    out = run(convert(tmp_path, model, config), toks)
    assert out.shape == ref.shape
    cos = cosines(out, ref)
    assert cos.min() >= 0.9999, cos
    np.testing.assert_array_equal(out.argmax(1), ref.argmax(1))


def test_multi_ubatch_and_token_by_token_give_the_same_logits(tmp_path: Path) -> None:
    """n_ubatch < sequence (several ubatches over a filling KV cache) and one token per decode call."""
    model, config = build("llama", seed=3)
    toks = tokens_for(config.vocab_size, seed=3)
    path = convert(tmp_path, model, config)
    ref = hf_logits(model, toks)
    full = run(path, toks)
    split = run(path, toks, n_ubatch=5)
    single = run(path, toks, one_by_one=True)
    for out in (split, single):
        assert cosines(out, ref).min() >= 0.9999
        np.testing.assert_allclose(out, full, atol=2e-3 * np.abs(full).max())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("flash_attn", [False, True], ids=["kq-softmax", "flash-attn"])
def test_f32_kv_cache_and_flash_attention(tmp_path: Path, arch: str, flash_attn: bool) -> None:
    """With an F32 KV cache nothing is rounded to F16 on the way: llama/qwen2 logits agree to ~1e-6.

    Measured max |diff| 1.4e-6 to 1.7e-6 (logits up to ~3); gemma3 stays at ~8e-4 because ggml's (and
    pyggml's) F32 GELU goes through an fp16 lookup table.
    """
    model, config = build(arch, seed=7)
    toks = tokens_for(config.vocab_size, seed=7)
    ref = hf_logits(model, toks)
    out = run(convert(tmp_path, model, config), toks, n_ubatch=7, flash_attn=flash_attn,
              type_k=GGMLType.F32, type_v=GGMLType.F32)
    assert cosines(out, ref).min() >= 0.9999
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-3 if arch == "gemma3" else 2e-5)


def test_gemma3_token_by_token_slides_the_window(tmp_path: Path) -> None:
    """24 tokens through an 8-token sliding window one at a time: the SWA cache must forget old cells."""
    model, config = build("gemma3", seed=4)
    toks = tokens_for(config.vocab_size, seed=4)
    ref = hf_logits(model, toks)
    out = run(convert(tmp_path, model, config), toks, one_by_one=True)
    assert cosines(out, ref).min() >= 0.9999


def test_llama3_rope_scaling_is_written_as_rope_freqs(tmp_path: Path) -> None:
    # a small base and original context put the 8 frequency pairs on all three branches of the rule
    rope = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    model, config = build("llama", rope_parameters=rope, seed=5)
    toks = tokens_for(config.vocab_size, seed=5)
    path = convert(tmp_path, model, config)
    m = Model(path, progress=False)
    f = m.layers[0].rope_freqs.numpy().reshape(-1)
    assert f.shape == (8,) and f[0] == 1.0 and f[-1] == 8.0 and np.any((f > 1.0) & (f < 8.0))
    ref = hf_logits(model, toks)
    assert cosines(run(path, toks), ref).min() >= 0.9999
    # the scaling matters: the same weights without it give clearly different logits
    plain, _ = build("llama", rope_parameters={"rope_type": "default", "rope_theta": 100.0}, seed=5)
    assert cosines(hf_logits(plain, toks), ref).min() < 0.999


def test_the_llama_qk_permutation_is_what_makes_it_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without llama.cpp's Q/K row permutation the NORM RoPE pairs the wrong dimensions: the F32 check fails."""
    model, config = build("llama")
    toks = tokens_for(config.vocab_size)
    monkeypatch.setattr(convert_arch, "llama_permute", lambda w, n_head: w)
    out = run(convert(tmp_path, model, config), toks)
    assert cosines(out, hf_logits(model, toks)).min() < 0.999


def test_llama_permute_turns_rotate_half_into_adjacent_pairs() -> None:
    """HF's RoPE (rotate_half over halves) on W equals ggml's NORM RoPE (adjacent pairs) on permuted W."""
    rng = np.random.default_rng(0)
    n_head, d, n_in, pos = 3, 8, 5, 7.0
    w = rng.standard_normal((n_head * d, n_in))
    x = rng.standard_normal(n_in)
    theta = pos * 10000.0 ** (-np.arange(0, d, 2) / d)
    c, s = np.cos(theta), np.sin(theta)
    q = (w @ x).reshape(n_head, d)
    a, b = q[:, : d // 2], q[:, d // 2:]
    hf = np.concatenate([a * c - b * s, b * c + a * s], axis=1)  # rotate_half
    qp = (convert_arch.llama_permute(w, n_head) @ x).reshape(n_head, d)
    e, o = qp[:, 0::2], qp[:, 1::2]
    norm = np.empty_like(qp)
    norm[:, 0::2], norm[:, 1::2] = e * c - o * s, e * s + o * c  # ggml NORM rope
    np.testing.assert_allclose(norm[:, 0::2], hf[:, : d // 2], atol=1e-12)
    np.testing.assert_allclose(norm[:, 1::2], hf[:, d // 2:], atol=1e-12)


# ---------------------------------------------------------------------------------------------- quantized


def dequantized_copy(model: Any, config: Any, ftype: str) -> Any:
    """The model with every 2-d weight replaced by what the GGUF file stores (rounded or quantized)."""
    clone = type(model)(config).eval()
    clone.load_state_dict(model.state_dict())
    wanted = FTYPES[ftype][0]
    with torch.no_grad():
        for _, p in clone.named_parameters():
            ty = tensor_type("w.weight", tuple(p.shape), wanted)
            if p.ndim != 2:
                continue
            if ty.is_quantized:
                q = quants.quantize(p.numpy().astype(np.float32), ty)
                p.copy_(torch.from_numpy(quants.dequantize(q, ty)))
            elif ty in (GGMLType.F16, GGMLType.BF16):
                p.copy_(p.to(torch.float16 if ty == GGMLType.F16 else torch.bfloat16).float())
    return clone


@pytest.mark.parametrize(("ftype", "tight", "loose"), [("f16", 0.99999, 0.99999), ("bf16", 0.99995, 0.9998)])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_half_precision_logits(tmp_path: Path, arch: str, ftype: str, tight: float, loose: float) -> None:
    """F16/BF16 weights; ggml also rounds the activations to the weight type before each dot product.

    Measured on seeds 0-2 (min over positions): f16 0.9999994 against the rounded weights, 0.9999983 against
    the original; bf16 0.999976 and 0.999927.
    """
    model, config = build(arch)
    toks = tokens_for(config.vocab_size)
    path = convert(tmp_path, model, config, ftype)
    types = {t.name: t.type for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == FTYPES[ftype][0] and types["output_norm.weight"] == GGMLType.F32
    out = run(path, toks)
    assert cosines(out, hf_logits(dequantized_copy(model, config, ftype), toks)).min() >= tight
    assert cosines(out, hf_logits(model, toks)).min() >= loose


# measured on seeds 0-2, llama and qwen2 (min over 24 positions): q8_0 0.99991-0.99994 against the dequantized
# weights, 0.99979-0.99985 against the original; q4_k 0.99982-0.99991 against the dequantized weights, 0.968-0.988
# against the original (random Gaussian weights lose ~7% rms per Q4_K matrix; HF on the dequantized weights is off
# by as much, so that loss is the format's, not pyggml's)
QUANT_BOUNDS = {"q8_0": (0.9995, 0.999), "q4_k": (0.999, 0.96)}


@pytest.mark.parametrize("ftype", ["q8_0", "q4_k"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_logits(tmp_path: Path, arch: str, ftype: str) -> None:
    # hidden 256 so Q4_K's 256-wide super-blocks fit every row; HF's own init scale (0.02)
    model, config = build(arch, hidden=256, inter=512, std=0.02)
    toks = tokens_for(config.vocab_size)
    path = convert(tmp_path, model, config, ftype)
    want = FTYPES[ftype][0]
    types = {t.name: t.type for t in GGUFReader(path).tensors}
    assert types["blk.0.ffn_down.weight"] == want and types["token_embd.weight"] == want
    assert types["blk.0.attn_norm.weight"] == GGMLType.F32
    out = run(path, toks)
    tight, loose = QUANT_BOUNDS[ftype]
    near = cosines(out, hf_logits(dequantized_copy(model, config, ftype), toks))
    assert near.min() >= tight, near
    far = cosines(out, hf_logits(model, toks))
    assert far.min() >= loose, far


# ---------------------------------------------------------------------------------------------- the file itself


def test_metadata_names_and_shapes_as_llama_cpp_writes_them(tmp_path: Path) -> None:
    """Read back with the independent ``gguf`` package: keys, value types, tensor names, ggml shapes."""
    model, config = build("qwen2", hidden=64, inter=96)
    r = gguf.GGUFReader(convert(tmp_path, model, config, "f16"))
    fields = {k: (f.types[0], f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    assert fields["general.architecture"][1] == "qwen2"
    assert fields["qwen2.block_count"] == (u32, 2)
    assert fields["qwen2.context_length"] == (u32, 256)
    assert fields["qwen2.embedding_length"] == (u32, 64)
    assert fields["qwen2.feed_forward_length"] == (u32, 96)
    assert fields["qwen2.attention.head_count"] == (u32, 4)
    assert fields["qwen2.attention.head_count_kv"] == (u32, 2)
    assert fields["qwen2.attention.layer_norm_rms_epsilon"][0] == f32
    assert fields["qwen2.attention.layer_norm_rms_epsilon"][1] == pytest.approx(config.rms_norm_eps)
    assert fields["qwen2.rope.freq_base"] == (f32, 10000.0)
    assert fields["general.file_type"] == (u32, 1)
    tensors = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert tensors["token_embd.weight"] == ("F16", [64, 512])
    assert tensors["output.weight"] == ("F16", [64, 512])
    assert tensors["output_norm.weight"] == ("F32", [64])
    assert tensors["blk.1.attn_q.weight"] == ("F16", [64, 64])
    assert tensors["blk.1.attn_k.weight"] == ("F16", [64, 32])
    assert tensors["blk.1.attn_k.bias"] == ("F32", [32])
    assert tensors["blk.1.attn_output.weight"] == ("F16", [64, 64])
    assert tensors["blk.1.ffn_gate.weight"] == ("F16", [64, 96])
    assert tensors["blk.1.ffn_down.weight"] == ("F16", [96, 64])
    assert tensors["blk.1.ffn_norm.weight"] == ("F32", [64])
    assert len(tensors) == 3 + 2 * 12
    # the bytes are torch's C order: a [out, in] matrix read back as (ne1, ne0) is the same matrix
    embd = np.asarray(r.tensors[[t.name for t in r.tensors].index("token_embd.weight")].data)
    np.testing.assert_array_equal(embd, model.model.embed_tokens.weight.detach().numpy().astype(np.float16))


def test_llama_and_gemma3_specific_keys(tmp_path: Path) -> None:
    model, config = build("llama", tie_word_embeddings=True)
    r = GGUFReader(convert(tmp_path, model, config))
    assert r.get("llama.rope.dimension_count") == 16 and r.get("llama.vocab_size") == 512
    assert r.get("llama.attention.key_length") == 16
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "rope_freqs.weight" not in names  # tied; no llama3 scaling
    model, config = build("gemma3")
    path = convert(tmp_path, model, config, "f32")
    r = GGUFReader(path)
    assert r.get("gemma3.attention.sliding_window") == 8
    assert list(r.get("gemma3.attention.sliding_window_pattern")) == [True, False]
    assert r.get("gemma3.rope.freq_base") == 1e6 and r.get("gemma3.rope.freq_base_swa") == 10000.0
    norm = Model(path, progress=False).layers[0].attn_q_norm.numpy().reshape(-1)
    hf = model.model.layers[0].self_attn.q_norm.weight.detach().numpy()
    np.testing.assert_allclose(norm, hf + 1.0, rtol=1e-6)  # stored +1, as llama.cpp's converter does


def test_numpy_state_dict_and_config_dict_give_the_same_file(tmp_path: Path) -> None:
    model, config = build("qwen2", tie_word_embeddings=True)
    a = convert_hf_model(model, config, tmp_path / "a.gguf", "q8_0")
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    b = convert_hf_model(sd, config.to_dict() | {"architectures": ["Qwen2ForCausalLM"]}, tmp_path / "b.gguf", "q8_0")
    assert a.read_bytes() == b.read_bytes()
    assert "output.weight" not in {t.name for t in GGUFReader(a).tensors}


@pytest.mark.parametrize(
    ("ftype", "n_per_row", "expected"),
    [
        ("q4_k", 256, GGMLType.Q4_K),
        ("q4_k", 64, GGMLType.Q5_0),  # llama-quantize's fallback for rows that are not whole super-blocks
        ("q4_k", 48, GGMLType.F16),
        ("q6_k", 96, GGMLType.Q8_0),
        ("q8_0", 48, GGMLType.F16),
        ("q8_0", 64, GGMLType.Q8_0),
        ("f16", 48, GGMLType.F16),
    ],
)
def test_tensor_type_fallbacks(ftype: str, n_per_row: int, expected: GGMLType) -> None:
    assert tensor_type("blk.0.ffn_up.weight", (8, n_per_row), FTYPES[ftype][0]) == expected
    assert tensor_type("blk.0.ffn_norm.weight", (n_per_row,), FTYPES[ftype][0]) == GGMLType.F32
    assert tensor_type("blk.0.attn_q.bias", (n_per_row,), FTYPES[ftype][0]) == GGMLType.F32


def test_q4_k_with_fallback_rows_still_runs(tmp_path: Path) -> None:
    """hidden 64: every weight falls back to Q5_0 (and the runner must multiply those too)."""
    model, config = build("llama", std=0.02)
    toks = tokens_for(config.vocab_size)
    path = convert(tmp_path, model, config, "q4_k")
    assert {t.type for t in GGUFReader(path).tensors if t.n_dims == 2} == {GGMLType.Q5_0}
    near = cosines(run(path, toks), hf_logits(dequantized_copy(model, config, "q4_k"), toks))
    assert near.min() >= 0.9995


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_input_raises_conversion_errors(tmp_path: Path) -> None:
    model, config = build("llama")
    with pytest.raises(ConversionError, match="unknown output type 'q3_x'"):
        convert_hf_model(model, config, tmp_path / "a.gguf", "q3_x")
    sd = dict(model.state_dict())
    sd["model.layers.0.self_attn.extra.weight"] = sd["model.norm.weight"]
    with pytest.raises(ConversionError, match=re.escape("cannot map tensor 'model.layers.0.self_attn.extra.weight'")):
        convert_hf_model(sd, config, tmp_path / "b.gguf")
    del sd["model.layers.1.mlp.up_proj.weight"], sd["model.layers.0.self_attn.extra.weight"]
    with pytest.raises(ConversionError, match=re.escape("llama: the model lacks blk.1.ffn_up.weight")):
        convert_hf_model(sd, config, tmp_path / "b.gguf")
    with pytest.raises(ConversionError, match="model_type 'gpt2'"):
        convert_hf_model({}, {"model_type": "gpt2"}, tmp_path / "c.gguf")
    with pytest.raises(ConversionError, match="lacks 'rms_norm_eps'"):
        convert_hf_model(sd, {k: v for k, v in config.to_dict().items() if k != "rms_norm_eps"}, tmp_path / "d.gguf",
                         arch="llama")
    with pytest.raises(ConversionError, match="RoPE scaling type 'yarn'"):
        convert_hf_model(model, {**config.to_dict(), "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
                         tmp_path / "e.gguf")
    qmodel, qconfig = build("qwen2")
    with pytest.raises(ConversionError, match="use_sliding_window"):
        convert_hf_model(qmodel, {**qconfig.to_dict(), "use_sliding_window": True}, tmp_path / "f.gguf")
    gmodel, gconfig = build("gemma3")
    with pytest.raises(ConversionError, match="query_pre_attn_scalar=256"):
        convert_hf_model(gmodel, {**gconfig.to_dict(), "query_pre_attn_scalar": 256}, tmp_path / "g.gguf")
    with pytest.raises(ConversionError, match="config must be a dict"):
        convert_hf_model(model, 42, tmp_path / "h.gguf")
    assert issubclass(ConversionError, PyGGMLError)
    assert not any(tmp_path.iterdir())  # nothing half-written


# ---------------------------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("kind", ["llama3", "qwen2"])
def test_converted_bpe_tokenizer_tokenizes_like_transformers(tmp_path: Path, kind: str) -> None:
    fixture = train(kind)
    tok = Tokenizer.from_str(fixture.hf.to_str())
    if kind == "llama3":  # Llama 3 adds BOS through its post-processor
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
        hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                      eos_token="<|end_of_text|>")
    else:
        hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                      pad_token="<|endoftext|>")
    n_tok = len(hf_tok)
    arch = "llama" if kind == "llama3" else "qwen2"
    model, config = build(arch, vocab=n_tok + 60)  # embedding rows beyond the tokenizer, as real models have
    path = convert(tmp_path, model, config, tokenizer=hf_tok)
    vocab = Vocab.from_gguf(path)
    assert vocab.n_tokens == n_tok + 60 == Model(path, progress=False).hparams.n_vocab
    assert vocab.token_get_text(n_tok + 59) == f"[PAD{n_tok + 59}]" and vocab.is_unused(n_tok + 59)
    assert vocab.is_user_defined(hf_tok.convert_tokens_to_ids("<custom_tag>"))
    # the same tokens, types and merges as the TOKENIZER helper's independent metadata builder
    r = GGUFReader(path)
    assert list(r.get("tokenizer.ggml.tokens"))[:n_tok] == fixture.metadata["tokenizer.ggml.tokens"]
    assert list(r.get("tokenizer.ggml.token_type"))[:n_tok] == fixture.metadata["tokenizer.ggml.token_type"]
    assert list(r.get("tokenizer.ggml.merges")) == fixture.metadata["tokenizer.ggml.merges"]
    assert r.get("tokenizer.ggml.pre") == fixture.metadata["tokenizer.ggml.pre"]
    assert r.get("tokenizer.ggml.add_bos_token") is (kind == "llama3")
    texts = ["Hello world, it's 2024!", "The quick brown fox: 12345 jumps.\n\n  def f(x):",
             "naïve café résumé <custom_tag> x"]
    for text in texts:
        assert vocab.tokenize(text, add_special=True) == hf_tok.encode(text), text
        assert vocab.tokenize(text, add_special=False) == hf_tok.encode(text, add_special_tokens=False), text


def test_greedy_generation_matches_transformers_generate(tmp_path: Path) -> None:
    """Text in, tokens out: pyggml's tokenizer, prompt decode, KV-cache generation loop and greedy sampler."""
    fixture = train("qwen2")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fixture.hf, eos_token="<|im_end|>")
    eos = hf_tok.eos_token_id
    model, config = build("qwen2", vocab=len(hf_tok), eos_token_id=eos, seed=8)
    path = convert(tmp_path, model, config, tokenizer=hf_tok)
    prompt = "The quick brown fox jumps over"
    vocab = Vocab.from_gguf(path)
    ids = vocab.tokenize(prompt, add_special=True)
    assert ids == hf_tok.encode(prompt)
    n_new = 16
    with torch.no_grad():
        hf_out = model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, eos_token_id=eos,
                                pad_token_id=eos)[0, len(ids):].tolist()
    ctx = LlamaContext(Model(path, progress=False), ContextParams(n_ctx=64, n_threads=2))
    gen = generate(ctx, vocab, ids, Sampler(SamplingParams(temp=0.0, seed=1)), n_predict=n_new)
    assert gen.tokens == hf_out[: len(gen.tokens)]
    if gen.stop_reason == "eog":
        assert hf_out[len(gen.tokens)] == eos
    else:
        assert len(gen.tokens) == n_new
    assert gen.text == hf_tok.decode(gen.tokens)


def test_tokenizer_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    fixture = train("qwen2")
    model, config = build("qwen2", vocab=300)
    with pytest.raises(ConversionError, match="vocab_size is only 300"):
        convert(tmp_path, model, config, tokenizer=fixture.hf)


# ---------------------------------------------------------------------------------------------- command line


def test_command_line_converts_a_saved_model_directory(tmp_path: Path) -> None:
    model, config = build("qwen2")
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "out.gguf"
    assert main([str(tmp_path / "hf"), "-o", str(out), "--outtype", "f32"]) == 0
    toks = tokens_for(config.vocab_size)
    assert cosines(run(out, toks), hf_logits(model, toks)).min() >= 0.9999
    assert main([str(tmp_path / "missing")]) == 1


# ---------------------------------------------------------------------------------------------- runner edge case


def test_gemma3_with_only_sliding_window_layers(tmp_path: Path) -> None:
    """Two layers with the default period of 6 are both SWA layers: the base KV cache has no layers at all."""
    model, config = build("gemma3", layer_types=["sliding_attention", "sliding_attention"], seed=6)
    toks = tokens_for(config.vocab_size, seed=6)
    path = convert(tmp_path, model, config)
    assert GGUFReader(path).get("gemma3.attention.sliding_window_pattern") is None  # the default pattern applies
    assert cosines(run(path, toks), hf_logits(model, toks)).min() >= 0.9999
