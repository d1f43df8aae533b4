"""Make completion_reference.json: llama.cpp's constrained generations, to compare pyggml's with.

Each case runs llama.cpp's ``llama-completion -m MODEL -p PROMPT --grammar-file G (or -j SCHEMA)
--temp T -s SEED -n N -no-cnv --no-display-prompt -fa off`` (commit 0c1e570; flash attention off
as LlamaContext's default, which the test uses: llama.cpp's "auto" turns it on, which rounds
differently and can flip a close pair of logits) and keeps the generated text
(stdout up to " [end of text]", which llama-completion prints at an end-of-generation token), as
bytes in ``text_hex`` (a generation cut at -n may end inside a UTF-8 character).
Models: the tiny random-weight qwen2 chat model of tests/helpers/chat_model.py (made here the same
way as the ``tiny_chat_path`` fixture; its sha256 is kept to catch a changed model), and the
packaged Gemma 3 270M Q4_K_M (its cases are checked only where it is installed). The grammars
are written here, or llama.cpp's grammars/json.gbnf and list.gbnf (kept in the JSON as data).
The random-weight model's logits have near-ties; a prompt whose greedy constrained path has two
allowed tokens within 0.01 of each other is avoided (llama.cpp's kernels round differently, so
such a tie may fall either way, grammar or not); Gemma's greedy paths have such ties every few
tokens (pyggml's and llama.cpp's logits differ by up to a few tenths), so its generations are kept
short enough to end before one or to agree anyway. Gemma is compared greedy only: its seeded
(temperature 0.8) generation already differs from llama-completion's without a grammar.

    PYTHONPATH=src python tests/data/grammar/make_completion_reference.py /path/to/llama.cpp
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
TESTS = HERE.parent.parent

PERSON = ('root ::= "{" ws "\\"name\\":" ws str "," ws "\\"age\\":" ws [0-9]+ ws "}"\n'
          'str ::= "\\"" [a-zA-Z ]* "\\""\nws ::= [ ]?\n')
FRENCH = 'root ::= "Réponse : " ("oui" | "non" | "peut-être") " — " [a-zàâçéèêëîïôûù ]{3,30} "."\n'
WORDS = 'root ::= word (" " word){4,9} "."\nword ::= [a-z]{2,8}\n'
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20}, "country": {"enum": ["France", "Japan", "Peru"]},
    "population": {"type": "integer", "minimum": 1000}, "founded": {"type": "string", "format": "date"}},
    "required": ["city", "country", "population"], "additionalProperties": False}
ARRAY_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "done": {"type": "boolean"}}, "required": ["name", "done"]},
    "minItems": 2, "maxItems": 3}


def cases(llama: Path) -> list[dict[str, object]]:
    json_gbnf = (llama / "grammars" / "json.gbnf").read_text()
    list_gbnf = (llama / "grammars" / "list.gbnf").read_text()
    tiny = [
        {"prompt": "hello there", "grammar": json_gbnf, "n": 24},
        {"prompt": "the list:", "grammar": list_gbnf, "n": 20},
        {"prompt": "one two", "grammar": WORDS, "n": 30},
        {"prompt": "the city of", "json_schema": SCHEMA, "n": 40},
        {"prompt": "oui?", "grammar": FRENCH, "n": 30},
        {"prompt": "hello there", "grammar": json_gbnf, "n": 24, "temp": 0.8, "seed": 7},
    ]
    gemma = [
        {"prompt": "Write a JSON record for a person:", "grammar": PERSON, "n": 40},
        {"prompt": "List three fruits as JSON:", "grammar": json_gbnf, "n": 5},  # then a 0.25 logit tie
        {"prompt": "Shopping list:\n", "grammar": list_gbnf, "n": 30},
        {"prompt": "Describe Lima as JSON:", "json_schema": SCHEMA, "n": 48},
        {"prompt": "Give me two tasks as JSON:", "json_schema": ARRAY_SCHEMA, "n": 48},
        {"prompt": "Question : Paris est-elle en France ?\n", "grammar": FRENCH, "n": 30},
    ]
    return [{"model": "tiny-chat", **c} for c in tiny] + [{"model": "gemma", **c} for c in gemma]


def run_completion(binary: Path, model: Path, case: dict[str, object], tmp: Path) -> bytes:
    args = [str(binary), "-m", str(model), "-p", str(case["prompt"]), "--temp", str(case.get("temp", 0.0)),
            "-s", str(case.get("seed", 1)), "-n", str(case["n"]), "-no-cnv", "--no-display-prompt", "-t", "2",
            "--no-warmup", "-c", "512", "-fa", "off"]  # as the test's LlamaContext; llama.cpp's "auto" turns it on
    if "grammar" in case:
        g = tmp / "g.gbnf"
        g.write_text(str(case["grammar"]), encoding="utf-8")
        args += ["--grammar-file", str(g)]
    else:
        args += ["-j", json.dumps(case["json_schema"])]
    r = subprocess.run(args, capture_output=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"llama-completion failed: {r.stderr.decode(errors='replace')[-2000:]}")
    out = r.stdout  # bytes: a generation cut at -n may end inside a UTF-8 character
    end = out.find(b" [end of text]\n")
    if end >= 0:
        return out[:end]
    if not out.endswith(b"\n\n"):
        raise RuntimeError(f"unexpected llama-completion output {out!r}")
    return out[:-2]


def stable_completion(binary: Path, model: Path, case: dict[str, object], tmp: Path) -> bytes:
    """Two runs giving the same well-formed output (a run sometimes exits early, mid-output, with
    status 0: seen on this machine; such a run is retried)."""
    seen: list[bytes] = []
    for _ in range(6):
        try:
            text = run_completion(binary, model, case, tmp)
        except RuntimeError as e:
            print(f"retrying: {e}", file=sys.stderr)
            continue
        if text in seen:
            return text
        seen.append(text)
    raise RuntimeError(f"no two runs of llama-completion agree for {case}")


def main() -> None:
    llama = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/lc/llama.cpp")
    binary = llama / "build" / "bin" / "llama-completion"
    sys.path.insert(0, str(TESTS))
    from helpers.chat_model import make_chat_model
    from pyggml.llm.packaged import default_model_path

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        models = {"tiny-chat": make_chat_model(tmp / "tiny-chat.gguf"), "gemma": default_model_path()}
        shas = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in models.items()}
        out = []
        for case in cases(llama):
            text = stable_completion(binary, models[str(case["model"])], case, tmp)
            out.append({**case, "text": text.decode("utf-8", "replace"), "text_hex": text.hex()})
            print(case["model"], text)
    dest = HERE / "completion_reference.json"
    dest.write_text(json.dumps({"models_sha256": shas, "cases": out}, indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    print(f"wrote {dest} ({len(out)} cases)")


if __name__ == "__main__":
    main()
