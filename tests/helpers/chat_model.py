"""A tiny chat model for the server and chat tests: made in about a second, so those tests run on
every install instead of skipping without the 491 MB packaged Qwen2.5-Coder.

What it keeps of a real chat model is everything the code paths look at: the qwen2 architecture
(QKV biases, tied output), a real byte-level BPE vocabulary trained on helpers.bpe_build's corpus
with Qwen2's pre-tokenizer and special tokens (``<|im_start|>``, ``<|im_end|>`` as EOS), and a
``tokenizer.chat_template`` in the GGUF (Qwen2.5's shape, with a default system turn that the
built-in ChatML fallback lacks, so a test can tell which template rendered a prompt). Its weights
are random (numpy's PCG64, seed fixed; the matrices scaled up from quantize_models' 0.05 so that
the logits are peaked enough for each prompt to get its own greedy text rather than one token
repeated): it produces deterministic nonsense, so tests compare two ways of running it, never its
text with an expectation.

    python tests/helpers/chat_model.py OUT.gguf      # writes the model (deterministic bytes)
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Qwen2.5-Instruct's template, less tool calls: a default system turn when none is given
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: the default system line, for tests that check the GGUF's template (not ChatML) rendered a prompt
DEFAULT_SYSTEM = "You are a tiny test model."
#: the matrices' scale over quantize_models' (std 0.05 * 6 = 0.3)
WEIGHT_SCALE = 6.0


def make_chat_model(out: Path, vocab_size: int = 700) -> Path:
    """Write the tiny qwen2 chat model to ``out`` (2 layers, n_embd 64, F32, about 0.5 MB)."""
    from helpers.bpe_build import train
    from helpers.quantize_models import Spec, state_dict
    from pyggml.gguf import GGUFReader, GGUFWriter
    from pyggml.gguf.constants import Keys
    from pyggml.llm.convert import convert_hf_model

    tok = train("qwen2", vocab_size).hf
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    spec = Spec("qwen2", 64, 128, 2, 4, 2, n_vocab, True, "f32", 21)
    sd, config = state_dict(spec)
    sd = {k: v * WEIGHT_SCALE if v.ndim == 2 else v for k, v in sd.items()}
    config["max_position_embeddings"] = 4096
    eos = tok.token_to_id("<|im_end|>")
    raw = out.with_suffix(".raw.gguf")
    convert_hf_model(sd, config, raw, "f32", tokenizer=tok, arch="qwen2", name="tiny-chat",
                     special_token_ids={"eos": eos, "bos": tok.token_to_id("<|endoftext|>")})
    with GGUFReader(raw) as r:
        w = GGUFWriter.from_context(r)
        w.set_str(Keys.TOKENIZER_CHAT_TEMPLATE, CHAT_TEMPLATE)
        w.write(out)
    raw.unlink()
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers.*
    print(make_chat_model(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-chat.gguf")))
