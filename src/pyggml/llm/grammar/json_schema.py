"""JSON schema to GBNF, as llama.cpp's common/json-schema-to-grammar.cpp (with common/json-schema.cpp).

The schema is first read into typed nodes (:func:`schema_document`: the type keywords decide the kind,
``$ref`` targets resolved within the document), then each node becomes rules named after its place
in the schema (``root``, ``<prop>-kv``, ``<name>-item``, ``ref-defs-<name>`` ...). Rule names, rule
text and their order (sorted by name) are llama.cpp's, so a schema converts to the same grammar
text here as there, and so constrains generation the same way.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .parser import GrammarError

INT64_MIN, INT64_MAX, INT_MAX = -(1 << 63), (1 << 63) - 1, (1 << 31) - 1

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

#: (content, dependencies) of the built-in rules
PRIMITIVE_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}

STRING_FORMAT_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) '
             '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}

RESERVED_NAMES = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})
_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPE = re.compile(r'[\r\n"\\]')
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "-": "\\-", "]": "\\]", "\\": "\\\\"}
MAX_PATTERN_DEPTH = 100
_NON_LITERAL = frozenset("|.()[]{}*+?^$")
_ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = frozenset("^$.[]()|{}*+?")


class JsonSchemaError(GrammarError):
    """A JSON schema llama.cpp's converter refuses (bad keyword values, unresolvable $ref, invalid pattern)."""


# ---- the schema document (common/json-schema.cpp) ---------------------------------------------

@dataclass
class Node:
    """common_chat_schema: ``kind`` is one of any, ref, anyOf, allOf, const, enum, null, boolean, number,
    integer, string, array, tuple, object; the other fields belong to some kinds."""

    kind: str
    ref: str = ""
    target: Node | None = None
    children: list[Node] = field(default_factory=list)
    value: Any = None  # const
    values: list[Any] = field(default_factory=list)  # enum
    minimum: int = INT64_MIN
    maximum: int = INT64_MAX
    pattern: str = ""
    format: str = ""  # "", "uuid", "date", "time", "date-time"
    min_length: int = 0
    max_length: int = -1
    items: Node | None = None  # array
    tuple_items: list[Node] = field(default_factory=list)
    min_items: int = 0
    max_items: int = -1
    properties: list[tuple[str, Node, bool]] = field(default_factory=list)  # (name, schema, required)
    additional: Node | None = None  # None: no additional properties


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


class _Builder:
    """common_chat_schema_builder."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, Node | None] = {}
        self.pending: list[Node] = []

    @staticmethod
    def fail(path: str, msg: str) -> NoReturn:
        raise JsonSchemaError(f"JSON schema error at {path}: {msg}")

    def get_count(self, schema: dict, key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        v = schema[key]
        if not _is_int(v) or v < 0:
            self.fail(path, f"{key} must be a non-negative integer")
        return int(v)

    def get_bound(self, schema: dict, key: str, path: str, round_up: bool) -> int:
        v = schema[key]
        if _is_int(v):
            return int(v)
        if not _is_number(v):
            self.fail(path, f"{key} must be a number")
        return int(math.ceil(v) if round_up else math.floor(v))

    def get_format(self, schema: dict, path: str) -> str:
        if "format" not in schema:
            return ""
        f = schema["format"]
        if not isinstance(f, str):
            self.fail(path, "format must be a string")
        if f in ("date", "time", "date-time"):
            return f
        if f == "uuid" or (len(f) == 5 and f.startswith("uuid") and "1" <= f[4] <= "5"):
            return "uuid"
        return ""

    def resolve_ref(self, ref: str, path: str) -> Any:
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if re.match(r"\s*[+]?\d", sel) else len(target)
                if idx >= len(target):
                    self.fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def build_ref(self, value: Any, path: str) -> Node:
        if not isinstance(value, str):
            self.fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            self.fail(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value not in self.refs:
            self.refs[value] = None  # a cycle back to this $ref stops here
            self.refs[value] = self.build_node(self.resolve_ref(value, path), value)
        node = Node("ref", ref=value)
        self.pending.append(node)
        return node

    def build_alternatives(self, kind: str, alts: Any, path: str) -> Node:
        if not isinstance(alts, list):
            self.fail(path, "must be an array of schemas")
        if not alts:
            self.fail(path, "must not be empty")
        return Node(kind, children=[self.build_node(a, f"{path}/{i}") for i, a in enumerate(alts)])

    def build_object(self, schema: dict, path: str) -> Node:
        node = Node("object")
        required = set()
        if isinstance(schema.get("required"), list):
            required = {n for n in schema["required"] if isinstance(n, str)}
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, dict):
                self.fail(path, "properties must be an object")
            for name, prop in props.items():
                node.properties.append((name, self.build_node(prop, f"{path}/properties/{name}"), name in required))
        if "additionalProperties" in schema:
            add = schema["additionalProperties"]
            if isinstance(add, bool):
                if add:
                    node.additional = Node("any")
            elif isinstance(add, dict):
                node.additional = self.build_node(add, f"{path}/additionalProperties")
            else:
                self.fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional = Node("any")  # {"type": "object"} alone accepts any object
        return node

    def build_array(self, schema: dict, path: str) -> Node:
        node = Node("array")
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                return Node("tuple", tuple_items=[self.build_node(it, f"{path}/{key}/{i}")
                                                  for i, it in enumerate(items)])
            node.items = self.build_node(items, f"{path}/{key}")
        else:
            node.items = Node("any")
        node.min_items = self.get_count(schema, "minItems", path, 0)
        node.max_items = self.get_count(schema, "maxItems", path, -1)
        return node

    def build_string(self, schema: dict, path: str) -> Node:
        node = Node("string")
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                self.fail(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.format = self.get_format(schema, path)
        node.min_length = self.get_count(schema, "minLength", path, 0)
        node.max_length = self.get_count(schema, "maxLength", path, -1)
        return node

    def build_integer(self, schema: dict, path: str) -> Node:
        node = Node("integer")
        if "minimum" in schema:
            node.minimum = self.get_bound(schema, "minimum", path, True)
        elif "exclusiveMinimum" in schema:
            node.minimum = self.get_bound(schema, "exclusiveMinimum", path, False) + 1
        if "maximum" in schema:
            node.maximum = self.get_bound(schema, "maximum", path, False)
        elif "exclusiveMaximum" in schema:
            node.maximum = self.get_bound(schema, "exclusiveMaximum", path, True) - 1
        return node

    def build_node(self, schema: Any, path: str) -> Node:
        if not isinstance(schema, dict):
            self.fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.build_ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.build_alternatives("anyOf", schema[key], f"{path}/{key}")
        typ = schema.get("type")
        if isinstance(typ, list):  # {"type": [a, b], ...} is {"anyOf": [{"type": a, ...}, {"type": b, ...}]}
            if not typ:
                self.fail(path, "type must not be empty")
            return Node("anyOf", children=[self.build_node({**schema, "type": t}, f"{path}/type/{i}")
                                           for i, t in enumerate(typ)])
        if "const" in schema:
            return Node("const", value=schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                self.fail(path, "enum must be a non-empty array")
            return Node("enum", values=list(values))
        if typ is not None and not isinstance(typ, str):
            self.fail(path, "type must be a string or an array of strings")
        type_name = typ if isinstance(typ, str) else ""
        add = schema.get("additionalProperties", True)
        has_properties = "properties" in schema or ("additionalProperties" in schema
                                                    and not (isinstance(add, bool) and add))
        if not type_name:  # the structural keywords decide
            if has_properties:
                return self.build_object(schema, path)
            if "allOf" in schema:
                return self.build_alternatives("allOf", schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.build_array(schema, path)
            if ("pattern" in schema or "minLength" in schema or "maxLength" in schema
                    or self.get_format(schema, path)):
                return self.build_string(schema, path)
            return Node("any")
        if type_name == "object":
            if not has_properties and "allOf" in schema:
                return self.build_alternatives("allOf", schema["allOf"], f"{path}/allOf")
            return self.build_object(schema, path)
        if type_name == "string":
            if "allOf" in schema:
                return self.build_alternatives("allOf", schema["allOf"], f"{path}/allOf")
            return self.build_string(schema, path)
        if type_name == "array":
            return self.build_array(schema, path)
        if type_name == "integer":
            return self.build_integer(schema, path)
        if type_name in ("number", "boolean", "null"):
            return Node(type_name)
        self.fail(path, f"unrecognized type {type_name}")

    def build(self) -> Node:
        root = self.build_node(self.root, "#")
        for node in self.pending:
            node.target = self.refs[node.ref]
        return root


def schema_document(schema: Any) -> Node:
    """common_chat_schema_from_json: the schema's root node (its $ref nodes point at their targets)."""
    return _Builder(schema).build()


# ---- helpers of the converter -------------------------------------------------------------------

def json_dump(value: Any) -> str:
    """nlohmann's compact dump (keys in document order, UTF-8 kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def format_literal(literal: str) -> str:
    """gbnf_format_literal: a GBNF string literal."""
    return '"' + _LITERAL_ESCAPE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'


def build_repetition(item_rule: str, min_items: int, max_items: int, separator_rule: str = "") -> str:
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item_rule + "?"
    if not separator_rule:
        if min_items == 1 and not has_max:
            return item_rule + "+"
        if min_items == 0 and not has_max:
            return item_rule + "*"
        return item_rule + "{" + str(min_items) + "," + (str(max_items) if has_max else "") + "}"
    rest = build_repetition(f"({separator_rule} {item_rule})", 0 if min_items == 0 else min_items - 1,
                            max_items - 1 if has_max else max_items)
    result = item_rule + " " + rest
    return f"({result})?" if min_items == 0 else result


def build_min_max_int(min_value: int, max_value: int, out: list[str], decimals_left: int = 16,
                      top_level: bool = True) -> None:
    """Rules for the decimal integers in [min_value, max_value] (INT64_MIN / INT64_MAX: unbounded)."""
    has_min, has_max = min_value != INT64_MIN, max_value != INT64_MAX

    def digit_range(a: str, b: str) -> None:
        out.append("[" + (a if a == b else f"{a}-{b}") + "]")

    def more_digits(lo: int, hi: int) -> None:
        out.append("[0-9]")
        if lo == hi == 1:
            return
        out.append("{" + str(lo))
        if hi != lo:
            out.append("," + (str(hi) if hi != INT_MAX else ""))
        out.append("}")

    def uniform_range(frm: str, to: str) -> None:
        i = 0
        while i < len(frm) and i < len(to) and frm[i] == to[i]:
            i += 1
        if i > 0:
            out.append('"' + frm[:i] + '"')
        if i < len(frm) and i < len(to):
            if i > 0:
                out.append(" ")
            sub_len = len(frm) - i - 1
            if sub_len > 0:
                from_sub, to_sub = frm[i + 1:], to[i + 1:]
                zeros, nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                out.append("(")
                if from_sub == zeros:
                    digit_range(frm[i], chr(ord(to[i]) - 1))
                    out.append(" ")
                    more_digits(sub_len, sub_len)
                else:
                    out.append(f"[{frm[i]}] (")
                    uniform_range(from_sub, nines)
                    out.append(")")
                    if ord(frm[i]) < ord(to[i]) - 1:
                        out.append(" | ")
                        if to_sub == nines:
                            digit_range(chr(ord(frm[i]) + 1), to[i])
                            to_reached = True
                        else:
                            digit_range(chr(ord(frm[i]) + 1), chr(ord(to[i]) - 1))
                        out.append(" ")
                        more_digits(sub_len, sub_len)
                if not to_reached:
                    out.append(" | ")
                    digit_range(to[i], to[i])
                    out.append(" ")
                    uniform_range(zeros, to_sub)
                out.append(")")
            else:
                out.append(f"[{frm[i]}-{to[i]}]")

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            build_min_max_int(-max_value, -min_value, out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            build_min_max_int(0, -min_value, out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            uniform_range(min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        uniform_range(min_s, max_s)
        return
    less_decimals = max(decimals_left - 1, 1)
    if has_min:
        if min_value < 0:
            out.append('"-" (')
            build_min_max_int(INT64_MIN, -min_value, out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            more_digits(0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                more_digits(0, less_decimals)
            else:
                more_digits(1, decimals_left)
        elif min_value <= 9:
            c = chr(ord("0") + min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                digit_range(range_start, chr(ord(c) - 1))
                out.append(" ")
                more_digits(1, less_decimals)
                out.append(" | ")
            digit_range(c, "9")
            out.append(" ")
            more_digits(0, less_decimals)
        else:
            min_s = str(min_value)
            n, c = len(min_s), min_s[0]
            if c > "1":
                digit_range("1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                more_digits(n, less_decimals)
                out.append(" | ")
            digit_range(c, c)
            out.append(" (")
            build_min_max_int(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                digit_range(chr(ord(c) + 1), "9")
                out.append(" ")
                more_digits(n - 1, less_decimals)
        return
    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                more_digits(0, less_decimals)
                out.append(" | ")
            build_min_max_int(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            build_min_max_int(-max_value, INT64_MAX, out, decimals_left, False)
            out.append(")")
        return
    raise JsonSchemaError("At least one of min_value or max_value must be set")


def _escape_length(pattern: str, pos: int) -> int:
    """gbnf_escape_length: the length of a GBNF escape at ``pos`` (0 if none)."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    e = pattern[pos + 1]
    if e in "trn\\\"[]-":
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(e, 0)
    if not n_hex or pos + 2 + n_hex > len(pattern):
        return 0
    if not all(h in "0123456789abcdefABCDEF" for h in pattern[pos + 2:pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _stoi(s: str) -> int:
    """std::stoi: leading spaces, a sign, digits (the rest ignored); ValueError without digits."""
    m = re.match(r"\s*([+-]?\d+)", s)
    if not m:
        raise ValueError(s)
    v = int(m.group(1))
    if not -(1 << 31) <= v < (1 << 31):
        raise ValueError(s)
    return v


class _UnsupportedPattern(Exception):
    pass


class _InvalidPattern(Exception):
    pass


# ---- the converter (common_chat_schema_converter) ------------------------------------------------

class SchemaConverter:
    """Turns schema nodes into named GBNF rules; ``format_grammar()`` writes them sorted by name."""

    def __init__(self, dotall: bool = False) -> None:
        self.dotall = dotall
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs_being_resolved: set[str] = set()
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def add_rule(self, name: str, rule: str) -> str:
        esc = _INVALID_RULE_CHARS.sub("-", name)
        if esc not in self.rules or self.rules[esc] == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        key = f"{esc}{i}"
        self.rules[key] = rule
        return key

    def add_primitive(self, name: str, rule: tuple[str, tuple[str, ...]]) -> str:
        n = self.add_rule(name, rule[0])
        for dep in rule[1]:
            dep_rule = PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES.get(dep)
            if dep_rule is None:
                self.errors.append(f"Rule {dep} not known")
                continue
            if dep not in self.rules:
                self.add_primitive(dep, dep_rule)
        return n

    def _union(self, name: str, alts: list[Node]) -> str:
        prefix = name + ("alternative-" if not name else "-")
        return " | ".join(self.visit(a, f"{prefix}{i}") for i, a in enumerate(alts))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return self._pattern_to_rule(pattern, name)
        except _UnsupportedPattern as e:
            self.rules = snapshot
            self.warnings.append(f"pattern {pattern} is not supported ({e}), accepting any string")
            return self.add_rule(name, self.add_primitive("string", PRIMITIVE_RULES["string"]))
        except _InvalidPattern as e:
            self.rules = snapshot
            self.errors.append(f"Invalid pattern {pattern}: {e}")
            return ""

    def _pattern_to_rule(self, pattern: str, name: str) -> str:
        if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            raise _UnsupportedPattern("not anchored with '^' and '$'")
        sub = pattern[1:-1]
        sub_rule_ids: dict[str, str] = {}
        n = len(sub)
        state = {"i": 0, "depth": 0}

        def to_rule(item: tuple[str, bool]) -> str:
            return f'"{item[0]}"' if item[1] else item[0]

        def transform() -> tuple[str, bool]:
            seq: list[tuple[str, bool]] = []

            def get_dot() -> str:
                return self.add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.dotall else "[^\\x0A\\x0D]")

            def join_seq() -> tuple[str, bool]:
                ret: list[tuple[str, bool]] = []
                literal = ""
                for s, is_lit in seq:
                    if is_lit:
                        literal += s
                    else:
                        if literal:
                            ret.append((literal, True))
                            literal = ""
                        ret.append((s, is_lit))
                if literal:
                    ret.append((literal, True))
                return " ".join(to_rule(x) for x in ret), False

            while state["i"] < n:
                i = state["i"]
                c = sub[i]
                if c == ".":
                    seq.append((get_dot(), False))
                    state["i"] += 1
                elif c == "(":
                    state["i"] += 1
                    i = state["i"]
                    if i < n and sub[i] == "?":
                        if i + 1 < n and sub[i + 1] == ":":
                            state["i"] += 2
                        else:
                            raise _UnsupportedPattern("unsupported group syntax")
                    state["depth"] += 1
                    if state["depth"] > MAX_PATTERN_DEPTH:
                        raise _UnsupportedPattern("pattern nesting too deep")
                    seq.append(("(" + to_rule(transform()) + ")", False))
                elif c == ")":
                    state["i"] += 1
                    if state["depth"] == 0:
                        raise _InvalidPattern("unbalanced parentheses")
                    state["depth"] -= 1
                    return join_seq()
                elif c in "^$":
                    raise _UnsupportedPattern("anchor inside the pattern")
                elif c == "[":
                    brackets = c
                    i += 1
                    while i < n and sub[i] != "]":
                        if sub[i] == "\\":
                            k = _escape_length(sub, i)
                            if k == 0:
                                raise _UnsupportedPattern("unsupported escape in character class: " + sub[i:i + 2])
                            brackets += sub[i:i + k]
                            i += k
                        else:
                            brackets += sub[i]
                            i += 1
                    if i >= n:
                        raise _InvalidPattern("unterminated character class")
                    state["i"] = i + 1
                    seq.append((brackets + "]", False))
                elif c == "|":
                    seq.append(("|", False))
                    state["i"] += 1
                elif c in "*+?":
                    if not seq:
                        raise _InvalidPattern("nothing to repeat")
                    seq[-1] = (to_rule(seq[-1]) + c, False)
                    state["i"] += 1
                elif c == "{":
                    curly = c
                    i += 1
                    while i < n and sub[i] != "}":
                        curly += sub[i]
                        i += 1
                    if i >= n:
                        raise _UnsupportedPattern("unterminated curly brackets")
                    curly += "}"
                    state["i"] = i + 1
                    nums = curly[1:-1].split(",")
                    min_times, max_times = 0, INT_MAX
                    if len(nums) not in (1, 2):
                        raise _UnsupportedPattern("wrong number of values in curly brackets")
                    try:
                        if len(nums) == 1:
                            min_times = max_times = _stoi(nums[0])
                        else:
                            if nums[0]:
                                min_times = _stoi(nums[0])
                            if nums[1]:
                                max_times = _stoi(nums[1])
                    except ValueError:
                        raise _UnsupportedPattern("invalid number in curly brackets") from None
                    if not seq:
                        raise _InvalidPattern("nothing to repeat")
                    s, is_lit = seq[-1]
                    if not is_lit:
                        sub_id = sub_rule_ids.get(s, "")
                        if not sub_id:
                            sub_rule_ids[s] = ""
                            sub_id = sub_rule_ids[s] = self.add_rule(f"{name}-{len(sub_rule_ids)}", s)
                        s = sub_id
                    seq[-1] = (build_repetition(f'"{s}"' if is_lit else s, min_times, max_times, ""), False)
                else:
                    literal = ""
                    while i < n:
                        if sub[i] == "\\":
                            if i == n - 1:
                                raise _InvalidPattern("trailing backslash")
                            nxt = sub[i + 1]
                            if nxt in _ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                                literal += nxt
                                i += 2
                            else:
                                k = _escape_length(sub, i)
                                if k == 0:
                                    raise _UnsupportedPattern("unsupported escape: " + sub[i:i + 2])
                                literal += sub[i:i + k]
                                i += k
                        elif sub[i] == '"':
                            literal += '\\"'
                            i += 1
                        elif sub[i] not in _NON_LITERAL and (i == n - 1 or not literal or sub[i + 1] == "."
                                                              or sub[i + 1] not in _NON_LITERAL):
                            literal += sub[i]
                            i += 1
                        else:
                            break
                    state["i"] = i
                    if not literal:
                        raise _UnsupportedPattern("unsupported character: " + c)
                    seq.append((literal, True))
            return join_seq()

        rule = to_rule(transform())
        if state["depth"] != 0:
            raise _InvalidPattern("unbalanced parentheses")
        return self.add_rule(name, '"\\"" (' + rule + ') "\\""')

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (built on their trie)."""
        trie: dict[str, Any] = {}
        end = "\0end"  # marks a word's end (never a code point key: keys are one character)
        for s in strings:
            node = trie
            for ch in s:
                node = node.setdefault(ch, {})
            node[end] = True
        char_rule = self.add_primitive("char", PRIMITIVE_RULES["char"])
        out = ['["] ( ']

        def visit(node: dict[str, Any]) -> None:
            children = sorted(k for k in node if k != end)
            for j, ch in enumerate(children):
                if j:
                    out.append(" | ")
                out.append(f"[{ch}]")
                child = node[ch]
                if any(k != end for k in child):
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char_rule}+")
            if children:
                out.append(f' | [^"{"".join(children)}] {char_rule}*')

        visit(trie)
        out.append(" )")
        if end not in trie:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def _resolve_ref(self, node: Node) -> str:
        ref = node.ref
        fragment = ref[ref.index("#") + 1:] if "#" in ref else ref
        ref_name = "ref" + _INVALID_RULE_CHARS.sub("-", fragment)
        if ref_name not in self.rules and ref not in self.refs_being_resolved:
            if node.target is None:
                self.errors.append(f"Unresolved $ref {ref}")
                return ""
            self.refs_being_resolved.add(ref)
            ref_name = self.visit(node.target, ref_name)
            self.refs_being_resolved.discard(ref)
        return ref_name

    def _build_object_rule(self, properties: list[tuple[str, Node]], required: set[str], name: str,
                           additional: Node | None) -> str:
        required_props: list[str] = []
        optional_props: list[str] = []
        kv_names: dict[str, str] = {}
        prop_names: list[str] = []
        dash = "" if not name else "-"
        for prop_name, prop_schema in properties:
            prop_rule = self.visit(prop_schema, name + dash + prop_name)
            kv_names[prop_name] = self.add_rule(name + dash + prop_name + "-kv",
                                                format_literal(json_dump(prop_name)) + ' space ":" space ' + prop_rule)
            (required_props if prop_name in required else optional_props).append(prop_name)
            prop_names.append(prop_name)
        if additional is not None:
            sub_name = name + dash + "additional"
            value_rule = (self.visit(additional, sub_name + "-value") if additional.kind != "any"
                          else self.add_primitive("value", PRIMITIVE_RULES["value"]))
            key_rule = (self.add_primitive("string", PRIMITIVE_RULES["string"]) if not prop_names
                        else self.add_rule(sub_name + "-k", self._not_strings(prop_names)))
            kv_names["*"] = self.add_rule(sub_name + "-kv", key_rule + ' ":" space ' + value_rule)
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv_names[k] for k in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(ks: list[str], first_is_optional: bool) -> str:
                if not ks:
                    return ""
                k = ks[0]
                kv = kv_names[k]
                comma_ref = f'( "," space {kv} )'
                if first_is_optional:
                    res = comma_ref + ("*" if k == "*" else "?")
                else:
                    res = kv + (" " + comma_ref + "*" if k == "*" else "")
                if len(ks) > 1:
                    res += " " + self.add_rule(name + dash + k + "-rest", recursive_refs(ks[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False) for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def _visit_primitive(self, rule_name: str, type_name: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else type_name, PRIMITIVE_RULES[type_name])

    def _visit_all_of(self, node: Node, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, Node]] = []
        enum_values: dict[str, int] = {}

        def add_component(comp: Node, is_required: bool) -> None:
            if comp.kind == "ref":
                if comp.target is not None:
                    add_component(comp.target, is_required)
            elif comp.kind == "object":
                for prop_name, prop_schema, _ in comp.properties:
                    properties.append((prop_name, prop_schema))
                    if is_required:
                        required.add(prop_name)
            elif comp.kind == "enum":
                for v in comp.values:
                    lit = format_literal(json_dump(v))
                    enum_values[lit] = enum_values.get(lit, 0) + 1

        for child in node.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        if enum_values:
            common = [lit for lit in sorted(enum_values) if enum_values[lit] == len(node.children)]
            if common:
                return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self._build_object_rule(properties, required, name, None))

    def visit(self, node: Node, name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else (name or "root")
        sub_name = name + ("-" if name else "")
        k = node.kind
        if k == "ref":
            return self.add_rule(rule_name, self._resolve_ref(node))
        if k == "anyOf":
            return self.add_rule(rule_name, self._union(name, node.children))
        if k == "allOf":
            return self._visit_all_of(node, name, rule_name)
        if k == "const":
            return self.add_rule(rule_name, format_literal(json_dump(node.value)))
        if k == "enum":
            return self.add_rule(rule_name, "(" + " | ".join(format_literal(json_dump(v)) for v in node.values) + ")")
        if k == "object":
            if not node.properties and node.additional is not None and node.additional.kind == "any":
                return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVE_RULES["object"]))
            props = [(n, s) for n, s, _ in node.properties]
            required = {n for n, _, r in node.properties if r}
            return self.add_rule(rule_name, self._build_object_rule(props, required, name, node.additional))
        if k == "tuple":
            parts = [self.visit(it, f"{sub_name}tuple-{i}") for i, it in enumerate(node.tuple_items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        if k == "array":
            assert node.items is not None
            if node.items.kind == "any" and node.min_items == 0 and node.max_items < 0:
                return self._visit_primitive(rule_name, "array")
            item_rule = self.visit(node.items, sub_name + "item")
            max_items = INT_MAX if node.max_items < 0 else node.max_items
            return self.add_rule(rule_name, '"[" space ' + build_repetition(item_rule, node.min_items, max_items,
                                                                            '"," space') + ' space "]"')
        if k == "string":
            if node.pattern:
                return self._visit_pattern(node.pattern, rule_name)
            if node.format == "uuid":
                return self._visit_primitive(rule_name, "uuid")
            if node.format:
                prim = node.format + "-string"
                return self.add_rule(rule_name, self.add_primitive(prim, STRING_FORMAT_RULES[prim]))
            if node.min_length > 0 or node.max_length >= 0:
                char_rule = self.add_primitive("char", PRIMITIVE_RULES["char"])
                max_len = INT_MAX if node.max_length < 0 else node.max_length
                return self.add_rule(rule_name, '"\\"" ' + build_repetition(char_rule, node.min_length, max_len)
                                     + ' "\\""')
            return self._visit_primitive(rule_name, "string")
        if k == "integer":
            if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
                return self._visit_primitive(rule_name, "integer")
            out = ["("]
            build_min_max_int(node.minimum, node.maximum, out)
            out.append(")")
            return self.add_rule(rule_name, "".join(out))
        if k in ("number", "boolean", "null"):
            return self._visit_primitive(rule_name, k)
        return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVE_RULES["value"]))  # any

    def check_errors(self, warn: Callable[[str], None] | None = None) -> None:
        if self.errors:
            raise JsonSchemaError("JSON schema conversion failed:\n" + "\n".join(self.errors))
        if self.warnings:
            msg = "JSON schema conversion was incomplete: " + "; ".join(self.warnings)
            if warn is None:
                print(f"WARNING: {msg}", file=sys.stderr)
            else:
                warn(msg)

    def format_grammar(self) -> str:
        return "".join(f"{k} ::= {v}\n" for k, v in sorted(self.rules.items()))


def json_schema_to_grammar(schema: Any, warn: Callable[[str], None] | None = None) -> str:
    """llama.cpp's json_schema_to_grammar(schema, force_gbnf=true): the GBNF text for a parsed JSON
    schema. Raises JsonSchemaError (llama.cpp's message) for a schema it cannot take; the warnings
    (unsupported patterns, accepted as any string) go to ``warn`` or stderr."""
    try:
        root = schema_document(schema)
    except JsonSchemaError as e:
        raise JsonSchemaError(f"JSON schema conversion failed:\n{e}") from None
    conv = SchemaConverter(False)
    conv.visit(root, "")
    conv.check_errors(warn)
    return conv.format_grammar()
