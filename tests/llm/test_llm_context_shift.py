"""A full context: stop with a message, or shift it as llama.cpp does; the sliding-window ring wraps.

The shift drops positions [n_keep, n_keep + n_discard) and moves the newer ones down by n_discard;
the cached K vectors are then re-rotated by the K-shift graph. In a one-layer model the cache holds
nothing that depends on the dropped tokens, so the shifted context must then give what a fresh context
gives after decoding the surviving tokens at their new positions (F32 cache: only float rounding
separates the two). With more layers, deeper K/V still carry the dropped context (as in llama.cpp).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.bpe_build import train  # noqa: E402
from helpers.hf_models import build, convert  # noqa: E402
from pyggml.cli.main import main  # noqa: E402
from pyggml.llm.context import ContextParams, LlamaContext  # noqa: E402
from pyggml.llm.model import Model  # noqa: E402
from pyggml.types import GGMLType  # noqa: E402


def _ctx(path: Path, n_ctx: int) -> LlamaContext:
    return LlamaContext(Model(path, progress=False),
                        ContextParams(n_ctx=n_ctx, n_ubatch=16, n_threads=2, type_k=GGMLType.F32, type_v=GGMLType.F32))


@pytest.mark.parametrize(("arch", "extra"), [
    ("llama", {}),
    ("gemma3", {"layer_types": ["sliding_attention"]}),
    ("gemma3", {"layer_types": ["full_attention"]}),
], ids=["llama", "gemma3-swa", "gemma3-global"])
def test_shifted_context_equals_a_fresh_decode_of_what_it_kept(tmp_path: Path, arch: str, extra: dict) -> None:
    model, config = build(arch, seed=5, num_hidden_layers=1, **extra)
    path = convert(tmp_path, model, config)
    toks = np.random.default_rng(5).integers(0, config.vocab_size, 40).tolist()
    ctx = _ctx(path, 64)
    ctx.decode(toks)
    n_keep = 3
    dropped = ctx.context_shift(n_keep)
    assert dropped == (40 - n_keep) // 2 and ctx.n_past == 40 - dropped
    shifted = ctx.decode([7])[-1]
    kept = toks[:n_keep] + toks[n_keep + dropped :]
    fresh = _ctx(path, 64)
    fresh.decode(kept)
    ref = fresh.decode([7])[-1]
    cos = float(np.dot(shifted, ref) / (np.linalg.norm(shifted) * np.linalg.norm(ref)))
    assert cos > 0.99999, cos
    np.testing.assert_allclose(shifted, ref, atol=1e-4 * np.abs(ref).max())


def test_a_shift_without_room_to_drop_is_an_error(tmp_path: Path) -> None:
    model, config = build("llama", seed=6)
    ctx = _ctx(convert(tmp_path, model, config), 64)
    ctx.decode([1, 2, 3])
    with pytest.raises(Exception, match="cannot shift"):
        ctx.context_shift(3)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    fixture = train("llama3")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fixture.hf, bos_token="<|begin_of_text|>",
                                                  eos_token="<|end_of_text|>")
    model, config = build("llama", vocab=len(hf_tok), seed=8)
    return convert(tmp_path_factory.mktemp("shift"), model, config, tokenizer=hf_tok)


def test_generate_stops_at_a_full_context_with_a_message(tiny_model: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["generate", "-m", str(tiny_model), "-p", "Hello world", "-c", "64", "-n", "40", "--temp", "0",
            "--ignore-eos", "-t", "1"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "stop: n_predict" in err
    # -c is honoured as given (the KV cache still holds a page of 256 cells): 150 tokens do not fit in 64
    assert main([*args[:8], "150", *args[9:]]) == 0
    err = capsys.readouterr().err
    assert "context full" in err and "--context-shift" in err and "stop: context full" in err
    assert "Traceback" not in err


def test_generate_with_context_shift_writes_every_token(tiny_model: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", "-m", str(tiny_model), "-p", "Hello world", "-c", "64", "-n", "700", "--temp", "0",
                 "--ignore-eos", "--context-shift", "--keep", "2", "-t", "1"]) == 0
    err = capsys.readouterr().err
    assert "stop: n_predict" in err and "context shifts" in err
    assert "generation: 700 tokens" in err


@pytest.mark.parametrize("bad", [["-n", "-5"], ["--keep", "-2"]])
def test_generate_refuses_negative_counts(tiny_model: Path, capsys: pytest.CaptureFixture, bad: list[str]) -> None:
    assert main(["generate", "-m", str(tiny_model), "-p", "x", *bad]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Gemma 3 (one sliding-window layer of window 8, one global layer: both of Gemma 3's caches)
    with a BPE vocabulary: the cache logic of Gemma 3 270M at a thousandth of its decode time."""
    import transformers

    fixture = train("llama3")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fixture.hf, bos_token="<|begin_of_text|>",
                                                  eos_token="<|end_of_text|>")
    model, config = build("gemma3", vocab=len(hf_tok), seed=9)
    return convert(tmp_path_factory.mktemp("gemma3"), model, config, tokenizer=hf_tok)


def test_gemma_generates_past_its_sliding_window_cache(tiny_gemma: Path, capsys: pytest.CaptureFixture) -> None:
    """Gemma 3's sliding-window cache holds n_swa + n_ubatch cells, padded to 256 (8 + 32 -> 256 here; 512 + 32
    -> 768 in Gemma 3 270M): generating past that wraps its ring (this used to fail with an IndexError at the
    wrap), twice over here."""
    ctx = LlamaContext(Model(tiny_gemma, progress=False), ContextParams(n_ctx=1024, n_batch=32, n_ubatch=32))
    assert ctx.caches["swa"].size == 256 and ctx.caches["base"].size == 1024
    assert main(["generate", "-m", str(tiny_gemma), "-p", "Once upon a time", "-c", "1024", "-b", "32", "-ub", "32",
                 "-n", "600", "--temp", "0", "--ignore-eos", "-t", "2"]) == 0
    err = capsys.readouterr().err
    assert "generation: 600 tokens" in err and "stop: n_predict" in err


def test_gemma_shifts_its_context(tiny_gemma: Path, capsys: pytest.CaptureFixture) -> None:
    """Gemma 3 (both caches: sliding-window and global layers) past a full context with --context-shift."""
    args = ["generate", "-m", str(tiny_gemma), "-p", "Once upon a time", "-c", "256", "-n", "300", "--temp", "0",
            "--ignore-eos", "-t", "2"]
    assert main(args) == 0
    assert "stop: context full" in capsys.readouterr().err
    assert main([*args, "--context-shift"]) == 0
    err = capsys.readouterr().err
    assert "generation: 300 tokens" in err and "context shifts" in err
