"""``pyggml serve`` with speculative decoding: the engine's slots, each with its own drafts in the one batch
of a step, reply what they reply without speculation (greedy), for a draft model that agrees, one that
does not, and n-gram lookup. The tiny random models of tests/data/archs share one vocabulary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pyggml.cli.main import main
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model
from pyggml.llm.sampling import SamplingParams
from pyggml.llm.speculative import ModelDrafter, NgramDrafter, SpecStats
from pyggml.llm.tokenizer import Vocab
from pyggml.serve.engine import DoneEvent, Engine, Task, TaskParams, TokenEvent

ARCHS = Path(__file__).resolve().parents[1] / "data" / "archs"
PROMPTS = ["hello world, the cat sat on the mat. the cat sat on", "the dog is in the city of paris and the dog",
           "what is the capital of france? the capital of"]


@pytest.fixture(scope="module")
def models() -> tuple[Model, Model, Vocab]:
    target = Model(ARCHS / "llama.gguf", progress=False)
    return target, Model(ARCHS / "qwen2.gguf", progress=False), Vocab.from_metadata(target.reader)


def _ctx(model: Model, n_seq: int) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=512, n_threads=1, n_seq_max=n_seq))


def _serve(models, drafters=None, spec_pad: int = 0, n_predict: int = 40) -> tuple[list, SpecStats]:
    """Three requests on two slots (the third waits for a free one, then reuses its cached prefix)."""
    target, _, vocab = models

    async def run() -> tuple[list, SpecStats]:
        eng = Engine(_ctx(target, 2), vocab, n_parallel=2, n_ctx=512, drafters=drafters, spec_pad=spec_pad)
        tasks = [Task(vocab.tokenize(p, add_special=True), TaskParams(n_predict=n_predict + 7 * i,
                                                                      sampling=SamplingParams(temp=0.0),
                                                                      ignore_eos=True))
                 for i, p in enumerate(PROMPTS)]
        for t in tasks:
            eng.submit(t)
        while eng.step():
            pass
        await asyncio.sleep(0.01)
        out = []
        for t in tasks:
            toks, text, finish = [], "", ""
            while not t.queue.empty():
                ev = t.queue.get_nowait()
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token)
                    text += ev.text
                elif isinstance(ev, DoneEvent):
                    finish = ev.finish_reason
            out.append((toks, text, finish))
        return out, eng.spec_stats

    return asyncio.run(run())


@pytest.fixture(scope="module")
def plain(models):
    return _serve(models)[0]


@pytest.mark.parametrize("n_max", [2, 5])
def test_self_draft_serves_plain_replies(models, plain, n_max):
    target = models[0]
    out, st = _serve(models, [ModelDrafter(_ctx(target, 2), n_max)], spec_pad=n_max)
    assert out == plain and all(f == "length" for _, _, f in out)
    assert st.n_accepted == st.n_drafted > 0


def test_disagreeing_draft_and_ngram_serve_plain_replies(models, plain):
    out, st = _serve(models, [NgramDrafter(2, 6), ModelDrafter(_ctx(models[1], 2), 3)], spec_pad=3)
    assert out == plain
    assert st.by_type["ngram-simple"][2] > 0 and st.by_type["draft-simple"][1] > 0


def test_serve_refuses_bad_speculative_flags(capsys):
    pytest.importorskip("uvicorn")
    from helpers.serve_util import free_port

    port = str(free_port())
    assert main(["serve", "-m", str(ARCHS / "llama.gguf"), "-md", str(ARCHS / "bert.gguf"), "--port", port, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: -md") and "vocabulary type is WPM" in err
    assert main(["serve", "-m", str(ARCHS / "llama.gguf"), "--spec-type", "draft-simple", "--port", port]) == 1
    assert "needs a draft model" in capsys.readouterr().err
