"""Make json_schema_grammars.json: llama.cpp's GBNF for each JSON schema below.

The reference converter is llama.cpp's own ``json_schema_to_grammar(schema, force_gbnf=true)``
(common/json-schema-to-grammar.cpp, commit 0c1e570), called by the small C++ driver below, built
against the checkout's libllama-common.so. The schemas are the ones written here plus the schemas
of llama.cpp's tests/test-json-schema-to-grammar.cpp (read from the checkout and kept in the JSON as
data). A schema llama.cpp refuses keeps its error message. pyggml's tests compare with the JSON only.

    python tests/data/grammar/make_json_schema_reference.py /path/to/llama.cpp
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

DRIVER = r"""
#include "json-schema-to-grammar.h"
#include <iostream>
#include <sstream>
int main() {
    std::stringstream ss; ss << std::cin.rdbuf();
    try {
        std::cout << json_schema_to_grammar(common_json::parse(ss.str()), true);
    } catch (const std::exception & e) {
        std::cout << "ERROR: " << e.what();
        return 2;
    }
    return 0;
}
"""

SCHEMAS: list[tuple[str, object]] = [
    ("any", {}),
    ("string", {"type": "string"}),
    ("integer", {"type": "integer"}),
    ("number", {"type": "number"}),
    ("boolean", {"type": "boolean"}),
    ("null", {"type": "null"}),
    ("object-any", {"type": "object"}),
    ("array-any", {"type": "array"}),
    ("person", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                                 "email": {"type": "string", "format": "email"}},
                "required": ["name", "age"], "additionalProperties": False}),
    ("all-optional", {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"},
                                                       "c": {"type": "boolean"}}}),
    ("additional-typed", {"type": "object", "properties": {"id": {"type": "integer"}},
                          "required": ["id"], "additionalProperties": {"type": "number"}}),
    ("additional-any", {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": True}),
    ("additional-only", {"type": "object", "additionalProperties": {"type": "string"}}),
    ("enum", {"enum": ["red", "green", 3, None, True, {"k": [1, 2]}]}),
    ("const", {"const": "fixed \"value\"\n"}),
    ("string-enum-typed", {"type": "string", "enum": ["a", "b"]}),
    ("array-items", {"type": "array", "items": {"type": "integer"}}),
    ("array-min-max", {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4}),
    ("array-min", {"type": "array", "items": {"type": "boolean"}, "minItems": 1}),
    ("array-max1", {"type": "array", "items": {"type": "null"}, "maxItems": 1}),
    ("array-zero", {"type": "array", "items": {"type": "null"}, "maxItems": 0}),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"const": 1}]}),
    ("formats", {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
        "dt": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
        "u4": {"type": "string", "format": "uuid4"}}, "required": ["d", "t", "dt", "u", "u4"]}),
    ("string-lengths", {"type": "object", "properties": {
        "short": {"type": "string", "maxLength": 3}, "long": {"type": "string", "minLength": 2},
        "both": {"type": "string", "minLength": 1, "maxLength": 5}, "exact": {"type": "string", "minLength": 4,
                                                                               "maxLength": 4}}}),
    ("pattern-simple", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3,5}$"}),
    ("pattern-groups", {"type": "string", "pattern": "^(abc|de)+x?(?:y|z)*\\.txt$"}),
    ("pattern-dot", {"type": "string", "pattern": "^a.b.{2,}c$"}),
    ("pattern-escapes", {"type": "string", "pattern": "^\\+\\(\\d\\)$"}),
    ("pattern-unanchored", {"type": "string", "pattern": "[a-z]+"}),
    ("pattern-invalid", {"type": "string", "pattern": "^(abc$"}),
    ("int-min", {"type": "integer", "minimum": 5}),
    ("int-min-big", {"type": "integer", "minimum": 1234}),
    ("int-min-neg", {"type": "integer", "minimum": -42}),
    ("int-max", {"type": "integer", "maximum": 300}),
    ("int-max-neg", {"type": "integer", "maximum": -7}),
    ("int-range", {"type": "integer", "minimum": -15, "maximum": 1250}),
    ("int-range-neg", {"type": "integer", "minimum": -300, "maximum": -20}),
    ("int-exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}),
    ("int-fractional", {"type": "integer", "minimum": 1.5, "maximum": 9.5}),
    ("int-0-9", {"type": "integer", "minimum": 0, "maximum": 9}),
    ("ref-defs", {"$defs": {"point": {"type": "object",
                                      "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                      "required": ["x", "y"], "additionalProperties": False}},
                  "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
                  "required": ["a"]}),
    ("ref-recursive", {"$ref": "#/definitions/node", "definitions": {"node": {
        "type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
        "required": ["value"], "additionalProperties": False}}}),
    ("ref-unresolved", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    ("ref-external", {"$ref": "https://example.com/schema.json"}),
    ("anyof", {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
    ("oneof-objects", {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "number"}},
                                  "required": ["kind", "x"]},
                                 {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]}),
    ("type-list", {"type": ["string", "null"], "maxLength": 8}),
    ("allof-objects", {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                                 {"type": "object", "properties": {"b": {"type": "integer"}}},
                                 {"anyOf": [{"type": "object", "properties": {"c": {"type": "boolean"}}}]}]}),
    ("allof-enums", {"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}]}),
    ("nested", {"type": "object", "properties": {
        "user": {"type": "object",
                 "properties": {"name": {"type": "string"},
                                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
                 "required": ["name"]},
        "scores": {"type": "array", "items": {"type": "number"}}}, "required": ["user"]}),
    ("reserved-names", {"type": "object", "properties": {"string": {"type": "integer"}, "root": {"type": "string"},
                                                         "date": {"type": "boolean"}, "we ird/name!": {"type": "null"}},
                        "required": ["string", "root", "date", "we ird/name!"]}),
    ("unicode-props", {"type": "object", "properties": {"名前": {"type": "string"}, "café": {"const": "é"}},
                       "required": ["名前"]}),
    ("bad-min-items", {"type": "array", "minItems": -1}),
    ("bad-type", {"type": "strin"}),
    ("bad-enum", {"enum": []}),
    ("bad-not-object", {"type": "object", "properties": {"a": 3}}),
]


def harvested(llama: Path) -> list[tuple[str, object]]:
    """The schemas of llama.cpp's test-json-schema-to-grammar.cpp (each test's first raw string)."""
    src = (llama / "tests" / "test-json-schema-to-grammar.cpp").read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r'test\(\{\s*(SUCCESS|FAILURE),\s*"([^"]*)",\s*R"""\((.*?)\)"""', src, re.DOTALL):
        try:
            schema = json.loads(m.group(3))
        except json.JSONDecodeError:
            continue  # a few cases test llama.cpp's JSON parser on malformed text: not schemas
        out.append((f"llama-test: {m.group(2)}", schema))
    return out


def main() -> None:
    llama = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/lc/llama.cpp")
    lib = llama / "build" / "bin"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "driver.cpp").write_text(DRIVER)
        exe = Path(d) / "js2g"
        subprocess.run(["g++", "-std=c++17", "-O0", f"-I{llama / 'common'}", f"-I{llama / 'include'}",
                        f"-I{llama / 'ggml' / 'include'}", str(Path(d) / "driver.cpp"), "-o", str(exe), f"-L{lib}",
                        "-lllama-common", "-lllama", f"-Wl,-rpath,{lib}"], check=True)
        out = []
        for name, schema in SCHEMAS + harvested(llama):
            r = subprocess.run([str(exe)], input=json.dumps(schema, ensure_ascii=False), capture_output=True,
                               encoding="utf-8", timeout=60)
            entry: dict[str, object] = {"name": name, "schema": schema}
            if r.returncode == 0:
                entry["grammar"] = r.stdout
                warn = re.search(r"WARNING: JSON schema conversion was incomplete: (.*)", r.stderr)
                if warn:
                    entry["warning"] = warn.group(1)
            else:
                entry["error"] = r.stdout.removeprefix("ERROR: ")
            out.append(entry)
    dest = HERE / "json_schema_grammars.json"
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {dest} ({len(out)} schemas, {sum('error' in e for e in out)} refused)")


if __name__ == "__main__":
    main()
