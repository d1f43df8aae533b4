"""``pyggml serve`` end to end on the tiny chat model of helpers.chat_model: a chat model on every install
(the module beside this one serves Gemma 3 270M, a base model, through --chat-template gemma)."""

from __future__ import annotations

import contextlib
import io

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
openai = pytest.importorskip("openai")

from helpers.serve_util import live_server  # noqa: E402
from pyggml.cli.main import main  # noqa: E402

pytestmark = pytest.mark.subprocess


def test_chat_model_serves_its_own_template_like_pyggml_chat(tiny_chat_path, tmp_path) -> None:
    """A chat model's GGUF template (the tiny qwen2's has a default system turn that ChatML lacks) renders
    the server's chat prompt, and the greedy reply equals `pyggml chat`'s: what test_serve's packaged-model
    test checks (skipped without the 491 MB chat extra), on a model every install has."""
    from helpers.chat_model import DEFAULT_SYSTEM
    from pyggml.gguf import GGUFReader
    from pyggml.llm.chat import template_for
    from pyggml.llm.tokenizer import Vocab

    message = "Write hello world in Python."
    msgs = [{"role": "user", "content": message}]
    with GGUFReader(tiny_chat_path) as reader:
        vocab = Vocab.from_metadata(reader)
        rendered = template_for(reader, vocab).render(msgs, add_generation_prompt=True)
        chatml = template_for(reader, vocab, "chatml").render(msgs, add_generation_prompt=True)
    assert DEFAULT_SYSTEM in rendered and DEFAULT_SYSTEM not in chatml
    n_prompt = len(vocab.tokenize(rendered, add_special=True, parse_special=True))
    assert n_prompt != len(vocab.tokenize(chatml, add_special=True, parse_special=True))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["chat", "-m", str(tiny_chat_path), "-p", message, "-n", "8", "--temp", "0", "-c", "512", "-t",
                     "2", "-q"]) == 0
    expected = out.getvalue().removesuffix("\n")
    with live_server(["-m", str(tiny_chat_path), "-c", "1024", "-np", "2", "-t", "2", "-q"],
                     tmp_path / "tiny.log") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == expected and expected.strip()
        assert r.usage.prompt_tokens == n_prompt  # the GGUF's template, not the ChatML fallback
        assert client.models.list().data[0].id.endswith("tiny-chat.gguf")
