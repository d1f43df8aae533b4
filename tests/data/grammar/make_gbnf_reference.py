"""Make gbnf_validator.json: llama.cpp's verdict on each (grammar, string) case below.

For every grammar, llama.cpp's ``test-gbnf-validator GRAMMAR_FILE INPUT_FILE`` (commit 0c1e570) is
run on each string; its stdout says valid, or the error and its position, and a grammar llama.cpp
refuses prints its reason on stderr. The grammars are the ones below (written here) plus the
small example grammars of llama.cpp's ``grammars/`` folder, read from the llama.cpp checkout and
kept in the JSON as data. pyggml's tests (tests/llm/test_grammar.py) compare with the JSON only.

    python tests/data/grammar/make_gbnf_reference.py /path/to/llama.cpp
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

#: (name, grammar, strings); the strings are both accepted and refused ones
CASES: list[tuple[str, str, list[str]]] = [
    ("literal", 'root ::= "hello"', ["hello", "hell", "hello!", "", "Hello"]),
    ("alternates", 'root ::= "cat" | "dog" | "bird"\n', ["cat", "dog", "bird", "cow", "catdog", "do"]),
    ("sequence-group", 'root ::= ("a" | "b") ("c" "d" | "e")', ["acd", "be", "ae", "bcd", "ac", "abe"]),
    ("star-plus-opt", 'root ::= "x"* "y"+ "z"?', ["y", "xxy", "yyyz", "xyz", "z", "xx", "yzz", ""]),
    ("repeat-exact", 'root ::= [0-9]{3}', ["123", "12", "1234", "abc"]),
    ("repeat-min", 'root ::= "ab"{2,}', ["abab", "ababab", "ab", "ababa", ""]),
    ("repeat-range", 'root ::= [a-c]{1,3} "-" [x]{0,2}', ["a-", "abc-xx", "abca-", "-x", "b-xxx", "cc-x"]),
    ("repeat-spaces", 'root ::= "a" { 2 , 4 } "b"', ["aab", "aaaab", "ab", "aaaaab"]),
    ("nested-repeat", 'root ::= ("a" [bc]{1,2}){2}', ["abab", "abcac", "ab", "abcabcab", "acbcb"]),
    ("char-classes", 'root ::= [a-zA-Z_] [a-zA-Z0-9_-]*', ["_x9", "A-b", "9a", "a b", "z"]),
    ("negated-class", 'root ::= "\\"" [^"\\\\\\n]* "\\""', ['"abc"', '"a\\"', '"a\nb"', '""', '"x"y']),
    ("any-char", 'root ::= "<" .* ">"', ["<>", "<abc>", "<a>b>", "<é中>", "<", "x<>"]),
    ("dot-count", 'root ::= .{2}', ["ab", "é中", "a", "abc"]),
    ("escapes", 'root ::= "\\x41" "\\u00e9" "\\U0001F600" "\\t" [\\n\\r] "\\\\" "\\"" [\\[\\]\\-]',
     ["Aé😀\t\n\\\"[", "Aé😀\t\r\\\"-", "Aé😀\t\n\\\"a", "Ae😀\t\n\\\"]"]),
    ("unicode-ranges", 'root ::= [\\u4e00-\\u9fff]+ [ぁ-ん]?', ["中文", "中文あ", "あ", "中a"]),
    ("utf8-literal", 'root ::= "naïve " ("café" | "東京")', ["naïve café", "naïve 東京", "naive café"]),
    ("comments", '# a comment\nroot ::= item # trailing\n  ("," item)* # more\nitem ::= [0-9]+ # digits\n',
     ["1", "1,22,333", "1,", ",1"]),
    ("comments-ok", '# a comment\nroot ::= item ("," item)* # trailing\n\n# between rules\nitem ::= [0-9]+ # digits\n',
     ["1", "1,22,333", "1,", ",1"]),
    ("crlf", 'root ::= a b\r\na ::= "a"\r\nb ::= "b"\r\n', ["ab", "a", "ba"]),
    ("multiline-alternates", 'root ::= (\n  "one" |\n  "two"\n  | "three"\n)', ["one", "two", "three", "four"]),
    ("empty-alternate", 'root ::= "a" opt "c"\nopt ::= "b" | ', ["abc", "ac", "abbc"]),
    ("recursion", 'root ::= "(" inner ")"\ninner ::= | "(" inner ")" inner', ["()", "(())", "(()())", "(()", "())"]),
    ("rule-names", 'root ::= my-rule2\nmy-rule2 ::= "x" Rule-B\nRule-B ::= "y"', ["xy", "x", "yx"]),
    ("class-with-dash-end", 'root ::= [a-]+', ["a-a", "-", "b"]),
    ("token-grammar-chars", 'root ::= "a" | <[7]> "b"', ["a", "b", ""]),
    ("not-token", 'root ::= !<[3]> | "z"', ["z", "y"]),
    ("json-number", 'root ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?',
     ["0", "-12.5e+3", "1.", "01", "3E7", "1234567890123456", "12345678901234567"]),
    ("long-string", 'root ::= ("ab" | "a" "b"?)* "!"', ["ababaab!", "a!", "!", "abb!", "b!"]),
    # bad grammars: llama.cpp's message is the reference
    ("bad-undefined", 'root ::= foo bar\nbar ::= "x"', ["x"]),
    ("bad-undefined-later", 'root ::= bar\nbar ::= baz', ["x"]),
    ("bad-no-root", 'expr ::= "a"', ["a"]),
    ("bad-empty", "", [""]),
    ("bad-comment-only", "# nothing here\n", [""]),
    ("bad-unclosed-string", 'root ::= "abc', ["abc"]),
    ("bad-unclosed-class", 'root ::= [abc', ["a"]),
    ("bad-unclosed-group", 'root ::= ("a" | "b"', ["a"]),
    ("bad-escape", 'root ::= "\\q"', ["q"]),
    ("bad-hex", 'root ::= "\\x4g"', ["x"]),
    ("bad-short-u", 'root ::= [\\u12]', ["x"]),
    ("bad-assign", 'root := "a"', ["a"]),
    ("bad-name", 'root ::= "a"\n::= "b"', ["a"]),
    ("bad-repeat-nothing", 'root ::= *"a"', ["a"]),
    ("bad-repeat-int", 'root ::= "a"{x}', ["a"]),
    ("bad-repeat-close", 'root ::= "a"{2,3', ["aa"]),
    ("bad-repeat-comma", 'root ::= "a"{2 3}', ["aa"]),
    ("bad-too-many", 'root ::= "a"{2001}', ["a"]),
    ("bad-left-recursion", 'root ::= "a" | root "b"', ["a"]),
    ("bad-indirect-left-recursion", 'root ::= a\na ::= b "x" | "y"\nb ::= "" a', ["y"]),
    ("bad-trailing", 'root ::= "a" )', ["a"]),
    ("bad-token-name-no-vocab", 'root ::= <think>', ["a"]),
    ("bad-token-id", 'root ::= <[12>', ["a"]),
]

LLAMA_GRAMMARS = {
    "arithmetic": ["1+2=3\n", "(x1 * y) = 42\n", "a=b\nc=d\n", "1+=2\n", "A=1\n"],
    "list": ["- one\n- two\n", "- x\n", "-x\n", "- one\n- \n", "- a\u2028b\n"],
    "chess": ["1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n", "1. O-O-O Qxd8+\n2. a8=Q Kh1#\n", "1. e9 e5\n2. a1 a2\n"],
    "json": ['{"a": 1}', '{"a": [1, 2, {"b": null}], "c": "x\\u00e9"}', "[1]", '{"a": 01}', '{ }', '{"a":tru}'],
    "json_arr": ['[{"a": 1}, {"b": "c"}]', "[]", "[1, 2]", '[{"a": 1},]', "[ ]"],
    "english": ["Hello world.", "hello, World!", "A b c d", "émile"],
    "japanese": ["こんにちは", "日本語", "abc", "カタカナ"],
    "c": ["int main() {\n  return 0;\n}\n", "int f(int x) {\n  x = x + 1;\n}\n", "void g() {}\n", "int 1x() {}\n"],
}


def run_validator(binary: Path, grammar: str, text: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d:
        gpath, ipath = Path(d) / "g.gbnf", Path(d) / "input.txt"
        gpath.write_bytes(grammar.encode("utf-8"))
        ipath.write_bytes(text.encode("utf-8"))
        r = subprocess.run([str(binary), str(gpath), str(ipath)], capture_output=True, encoding="utf-8",
                           errors="replace", timeout=60)
    if "Failed to initialize llama_grammar" in r.stdout:
        # the reason: "parse: error parsing grammar: MSG", or a line of llama_grammar_init_impl's
        m = re.search(r"error parsing grammar: (.*)\n\n" + re.escape(grammar) + "\n", r.stderr, re.DOTALL)
        reason = f"error parsing grammar: {m.group(1)}" if m else r.stderr.strip().splitlines()[-1]
        return {"init_error": reason}
    if "Input string is valid" in r.stdout:
        return {"valid": True}
    m = re.search(r"Error: (.*?) at position (\d+)\n", r.stdout, re.DOTALL)
    if not m:
        raise RuntimeError(f"unexpected validator output: {r.stdout!r} {r.stderr!r}")
    return {"valid": False, "error": m.group(1), "error_pos": int(m.group(2))}


def main() -> None:
    llama = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/lc/llama.cpp")
    binary = llama / "build" / "bin" / "test-gbnf-validator"
    cases = list(CASES) + [(f"llama-{n}", (llama / "grammars" / f"{n}.gbnf").read_text(), s)
                           for n, s in LLAMA_GRAMMARS.items()]
    out = []
    for name, grammar, strings in cases:
        results = [run_validator(binary, grammar, s) for s in strings]
        entry: dict[str, object] = {"name": name, "grammar": grammar}
        if "init_error" in results[0]:
            entry["init_error"] = results[0]["init_error"]
        else:
            entry["strings"] = [{"text": s, **r} for s, r in zip(strings, results, strict=True)]
        out.append(entry)
    dest = HERE / "gbnf_validator.json"
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {dest} ({len(out)} grammars)")


if __name__ == "__main__":
    main()
