"""JSON schema to GBNF in llama-cpp-python's dialect (its ``llama_grammar.json_schema_to_gbnf``).

llama-cpp-python 0.3.x converts schemas with its own Python converter, an older port of llama.cpp's.
The JSON it allows differs from what llama.cpp's current converter (:mod:`pyggml.llm.grammar.json_schema`,
used by pyggml's server) allows in where whitespace may go: only a single optional space (``" "?``),
after every value and after ``{``, ``[``, ``:`` and ``,``, never before ``}`` or ``]``. A model that
pretty-prints JSON (Qwen2.5 does) writes ``{"a": 1}`` under this dialect and ``{\\n  "a": 1\\n}`` under
llama.cpp's, so ``LlamaGrammar.from_json_schema`` must speak this one to give llama-cpp-python's text.

The numbers, strings and formats are the dialect's too: integers may have leading zeros
(``[0-9] | [1-9] [0-9]{0,15}``), a string character is anything but ``"`` and ``\\`` or an escape
(``\\/`` included), ``date``/``time``/``date-time``/``uuid`` formats are checked. A ``pattern`` is turned
into a grammar by llama.cpp's regex translation (the language a regex stands for is the same
whichever converter writes it). Only local ``$ref`` (``#/...``) are followed; nothing is fetched.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..llm.grammar.json_schema import SchemaConverter as _LlamaCppConverter
from ..llm.grammar.json_schema import format_literal

SPACE = '" "?'
_DIGITS15 = "[0-9]{0,15}"
_PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false") space', ()),
    "decimal-part": (f"[0-9] {_DIGITS15}", ()),
    "integral-part": (f"[0-9] | [1-9] {_DIGITS15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part) space', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
               ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? "]" space', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} '
             '"\\"" space', ()),
    "char": ('[^"\\\\] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\"" space', ("char",)),
    "null": ('"null" space', ()),
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) '
             '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\"" space', ("date",)),
    "time-string": ('"\\"" time "\\"" space', ("time",)),
    "date-time-string": ('"\\"" date-time "\\"" space', ("date-time",)),
}
_RESERVED = frozenset({"root", "dot", *_PRIMITIVES})
_BAD_NAME = re.compile(r"[^a-zA-Z0-9-]+")


def _repeat(item: str, lo: int, hi: int | None, sep: str = "") -> str:
    """``item`` lo..hi times (hi None: unbounded), separated by ``sep``."""
    if hi is not None and hi < lo:
        raise ValueError(f"a maximum count ({hi}) below the minimum ({lo})")
    if not sep:
        return f"({item}){{{lo},{'' if hi is None else hi}}}"
    if hi == 0:
        return ""
    more_lo = max(lo - 1, 0)
    more = "" if hi == 1 else f" ({sep} {item}){{{more_lo},{'' if hi is None else hi - 1}}}"
    return f"({item}{more})" + ("" if lo > 0 else "?")


class _Converter:
    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.rules: dict[str, str] = {"space": SPACE}
        self.resolving: set[str] = set()

    def add(self, name: str, rule: str) -> str:
        key = base = _BAD_NAME.sub("-", name) or "root"
        i = 0
        while key in self.rules and self.rules[key] != rule:
            key, i = f"{base}{i}", i + 1
        self.rules[key] = rule
        return key

    def primitive(self, name: str, kind: str) -> str:
        rule, deps = _PRIMITIVES[kind]
        key = self.add(name, rule)
        for dep in deps:
            if dep not in self.rules:
                self.primitive(dep, dep)
        return key

    def target(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            raise ValueError(f"Unsupported ref {ref} (only local '#/...' references are followed)")
        node = self.schema
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"Error resolving ref {ref}: {part} not found")
            node = node[part]
        return node

    def visit(self, s: Any, name: str) -> str:
        if s is True:
            s = {}
        if not isinstance(s, dict):
            raise ValueError(f"Unrecognized schema: {s!r}")
        kind, fmt = s.get("type"), s.get("format")
        rule_name = name + "-" if name in _RESERVED else name or "root"
        dash = "-" if name else ""
        if "$ref" in s:
            ref = s["$ref"]
            ref_name = ref.split("/")[-1]
            if ref_name not in self.rules and ref not in self.resolving:
                self.resolving.add(ref)
                ref_name = self.visit(self.target(ref), ref_name)
                self.resolving.discard(ref)
            return self.add(rule_name, ref_name)
        if "oneOf" in s or "anyOf" in s:
            alts = s.get("oneOf") or s["anyOf"]
            return self.add(rule_name, self._union(name, alts))
        if isinstance(kind, list):
            return self.add(rule_name, self._union(name, [{"type": t} for t in kind]))
        if "const" in s:
            return self.add(rule_name, format_literal(json.dumps(s["const"])))
        if "enum" in s:
            return self.add(rule_name, " | ".join(format_literal(json.dumps(v)) for v in s["enum"]))
        if kind in (None, "object") and ("properties" in s or s.get("additionalProperties", True) is not True):
            props = list((s.get("properties") or {}).items())
            return self.add(rule_name, self._object(props, set(s.get("required", [])), name,
                                                    s.get("additionalProperties")))
        if kind in (None, "object") and "allOf" in s:
            props: list[tuple[str, Any]] = []
            required: set[str] = set()
            for comp in s["allOf"]:
                for alt, req in ([(c, False) for c in comp["anyOf"]] if "anyOf" in comp else [(comp, True)]):
                    if "$ref" in alt:
                        alt = self.target(alt["$ref"])
                    for pname, pschema in (alt.get("properties") or {}).items():
                        props.append((pname, pschema))
                        if req:
                            required.add(pname)
            return self.add(rule_name, self._object(props, required, name, None))
        if kind in (None, "array") and ("items" in s or "prefixItems" in s):
            items = s.get("items") or s["prefixItems"]
            if isinstance(items, list):
                parts = [self.visit(it, f"{name}{dash}tuple-{i}") for i, it in enumerate(items)]
                return self.add(rule_name, '"[" space ' + ' "," space '.join(parts) + ' "]" space')
            item = self.visit(items, f"{name}{dash}item")
            body = _repeat(item, int(s.get("minItems", 0)), s.get("maxItems"), '"," space')
            return self.add(rule_name, f'"[" space {body} "]" space')
        if kind in (None, "string") and "pattern" in s:
            return self._pattern(s["pattern"], rule_name)
        if kind in (None, "string") and re.match(r"^uuid[1-5]?$", fmt or ""):
            return self.primitive("root" if rule_name == "root" else fmt, "uuid")
        if kind in (None, "string") and f"{fmt}-string" in _PRIMITIVES:
            return self.add(rule_name, self.primitive(f"{fmt}-string", f"{fmt}-string"))
        if kind == "string" and ("minLength" in s or "maxLength" in s):
            char = self.primitive("char", "char")
            body = _repeat(char, int(s.get("minLength", 0)), s.get("maxLength"))
            return self.add(rule_name, f'"\\"" {body} "\\"" space')
        if kind == "object" or not s:
            return self.add(rule_name, self.primitive("object", "object"))
        if kind not in _PRIMITIVES:
            raise ValueError(f"Unrecognized schema: {s}")
        return self.primitive("root" if rule_name == "root" else kind, kind)

    def _union(self, name: str, alts: list[Any]) -> str:
        return " | ".join(self.visit(a, f"{name}{'-' if name else 'alternative-'}{i}") for i, a in enumerate(alts))

    def _object(self, props: list[tuple[str, Any]], required: set[str], name: str, additional: Any) -> str:
        dash = "-" if name else ""
        kv: dict[str, str] = {}
        for pname, pschema in props:
            value = self.visit(pschema, f"{name}{dash}{pname}")
            key = format_literal(json.dumps(pname))
            kv[pname] = self.add(f"{name}{dash}{pname}-kv", f'{key} space ":" space {value}')
        req = [p for p, _ in props if p in required]
        opt = [p for p, _ in props if p not in required]
        if additional is True or isinstance(additional, dict):
            value = self.visit({} if additional is True else additional, f"{name}{dash}additional-value")
            kv["*"] = self.add(f"{name}{dash}additional-kv", f'{self.primitive("string", "string")} ":" space {value}')
            opt.append("*")
        rule = '"{" space ' + ' "," space '.join(kv[p] for p in req)
        if opt:
            def chain(ks: list[str], optional_first: bool) -> str:
                k, rest = ks[0], ks[1:]
                if k == "*":
                    res = self.add(f"{name}{dash}additional-kvs", f'{kv[k]} ( "," space {kv[k]} )*')
                else:
                    res = f'( "," space {kv[k]} )?' if optional_first else kv[k]
                if rest:
                    res += " " + self.add(f"{name}{dash}{k}-rest", chain(rest, True))
                return res

            alts = " | ".join(chain(opt[i:], False) for i in range(len(opt)))
            rule += f' ( "," space ( {alts} ) )?' if req else f" ( {alts} )?"
        return rule + ' "}" space'

    def _pattern(self, pattern: str, rule_name: str) -> str:
        """A ``pattern`` string by llama.cpp's regex translation; its rules end with ``space``, which is
        this dialect's here (an unsupported pattern becomes any string, as there)."""
        conv = _LlamaCppConverter(False)
        key = conv._visit_pattern(pattern, rule_name)
        conv.check_errors(lambda msg: None)
        for k, rule in conv.rules.items():
            if k != "space":
                self.rules.setdefault(k, rule)
        self.rules[key] = conv.rules[key] + " space"  # as every value of this dialect, a space may follow
        return key


def json_schema_to_gbnf(schema: Any) -> str:
    """The GBNF text for a JSON schema (a dict, or its JSON text) in llama-cpp-python's dialect."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    conv = _Converter(schema)
    conv.visit(schema, "")
    return "".join(f"{k} ::= {v}\n" for k, v in sorted(conv.rules.items()))
