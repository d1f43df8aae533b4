"""Every architecture's tiny model against llama.cpp's outputs on the same file (tests/data/archs).

The F32 and quantized (Q8_0; gpt-oss: MXFP4_MOE) files and llama.cpp 0c1e570's logits and greedy tokens
were written by tests/data/archs/make_reference.py; pyggml runs the same prompt with the same context
settings (n_ctx 64, F16 KV cache, no flash attention) and must give the same logits at every position
(cosine >= 0.9999, the same top-1 wherever llama.cpp's top two differ by more than 1e-3) and the same
greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.llamacpp_match import assert_logits_and_greedy
from pyggml.llm.arch import supported_archs
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
REF = np.load(DATA / "reference.npz")
CASES = sorted(tuple(k[: -len("-logits")].rsplit("-", 1)) for k in REF.files if k.endswith("-logits"))
ARCHS = sorted({name for name, _ in CASES})


def _context(arch: str, kind: str) -> LlamaContext:
    name = f"{arch}.gguf" if kind == "f32" else f"{arch}-{kind}.gguf"
    return LlamaContext(Model(DATA / name, progress=False), ContextParams(n_ctx=64, n_batch=64, n_ubatch=64,
                                                                          n_threads=2))


@pytest.mark.parametrize(("arch", "kind"), CASES, ids=[f"{a}-{k}" for a, k in CASES])
def test_logits_and_greedy_equal_llamacpp(arch: str, kind: str) -> None:
    assert_logits_and_greedy(_context(arch, kind), REF["tokens"].tolist(), REF[f"{arch}-{kind}-logits"],
                             REF[f"{arch}-{kind}-greedy"], f"{arch} {kind}")


def test_every_registered_architecture_has_reference_data() -> None:
    """A new architecture module comes with its tiny model and llama.cpp's outputs: logits here, for an
    encoder its embeddings (test_llm_embeddings.py), for a recurrent or hybrid model recurrent.npz
    (test_llm_recurrent.py)."""
    embeddings = np.load(DATA / "embeddings.npz").files
    encoders = {k.rsplit("-", 1)[0] for k in embeddings if k.endswith("-none")}
    recurrent = {k.rsplit("-", 2)[0] for k in np.load(DATA / "recurrent.npz").files if k.endswith("-logits")}
    rwkv = {k.rsplit("-", 2)[0] for name in ("rwkv.npz", "lfm2.npz") for k in np.load(DATA / name).files
            if k.endswith("-logits")}
    covered = set(ARCHS) | encoders | recurrent | rwkv  # rwkv.npz, lfm2.npz: test_llm_rwkv_lfm2.py
    assert set(supported_archs()) <= covered, sorted(set(supported_archs()) - covered)
