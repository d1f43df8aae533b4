"""The GBNF parser of llama.cpp (``llama_grammar_parser`` in src/llama-grammar.cpp).

A grammar is parsed into rules of (type, value) elements, numbered as llama.cpp numbers them:
each rule name gets the next id when first seen, and groups and repetitions synthesize rules
named ``<rule>_<id>``. Keeping the same ids and the same rewriting of ``*``, ``+``, ``?`` and
``{m,n}`` keeps the pushdown stacks, and so the accepted strings, the same as llama.cpp's.
Bad grammars raise :class:`GrammarError` with llama.cpp's message.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

from ...errors import PyGGMLError

#: llama.cpp's MAX_REPETITION_THRESHOLD: the most rules a repetition may expand into
MAX_REPETITION_THRESHOLD = 2000
_UINT64_MAX = (1 << 64) - 1


class GrammarError(PyGGMLError, ValueError):
    """A grammar llama.cpp would refuse (parse error, undefined rule, no root, left recursion), or a
    token or string the grammar cannot take."""


class GreType(IntEnum):
    """llama_gretype: the element types of a parsed rule."""

    END = 0  # end of rule definition
    ALT = 1  # start of an alternate definition
    RULE_REF = 2  # reference to a rule
    CHAR = 3  # a code point (or the first of a char class)
    CHAR_NOT = 4  # the first of an inverse class [^...]
    CHAR_RNG_UPPER = 5  # makes the preceding CHAR/CHAR_ALT an inclusive range
    CHAR_ALT = 6  # another code point of the same class
    CHAR_ANY = 7  # "."
    TOKEN = 8  # <[id]> or <token>
    TOKEN_NOT = 9  # !<[id]>


#: the one-character escapes: \t \r \n and the escaped \\ " [ ] -
_SIMPLE_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}

Element = tuple[int, int]  # (GreType, value: code point, rule id or token id)
Rule = list[Element]


def is_word_char(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "-" or ("0" <= c <= "9")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class GrammarParser:
    """Parses GBNF text into ``rules`` (indexed by rule id) and ``symbol_ids`` (name -> id).

    ``tokenize``, if given, turns ``<name>`` into a token id (llama.cpp tokenizes the text with
    special tokens parsed and wants exactly one token); ``<[id]>`` needs no vocabulary.
    """

    def __init__(self, tokenize: Callable[[str], list[int]] | None = None) -> None:
        self.tokenize = tokenize
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[Rule] = []
        self._src = ""

    # ---- the text: a C string, ended by the first NUL ---------------------------------------

    def _c(self, pos: int) -> str:
        return self._src[pos] if pos < len(self._src) else "\0"

    def _rest(self, pos: int) -> str:
        return self._src[pos:]

    # ---- symbols and rules ------------------------------------------------------------------

    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base_name: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base_name}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: Rule) -> None:
        while len(self.rules) <= rule_id:
            self.rules.append([])
        self.rules[rule_id] = list(rule)

    # ---- lexical helpers (parse_space, parse_name, parse_int, parse_char, parse_hex) ----------

    def parse_space(self, pos: int, newline_ok: bool) -> int:
        c = self._c
        while (ch := c(pos)) in (" ", "\t", "#") or (newline_ok and ch in ("\r", "\n")):
            if ch == "#":
                while c(pos) not in ("\0", "\r", "\n"):
                    pos += 1
            else:
                pos += 1
        return pos

    def parse_name(self, pos: int) -> int:
        end = pos
        while is_word_char(self._c(end)):
            end += 1
        if end == pos:
            raise GrammarError(f"expecting name at {self._rest(pos)}")
        return end

    def parse_int(self, pos: int) -> int:
        end = pos
        while _is_digit(self._c(end)):
            end += 1
        if end == pos:
            raise GrammarError(f"expecting integer at {self._rest(pos)}")
        return end

    def parse_hex(self, pos: int, size: int) -> tuple[int, int]:
        start, value = pos, 0
        while pos < start + size and self._c(pos) != "\0":
            ch = self._c(pos)
            if "a" <= ch <= "f" or "A" <= ch <= "F" or "0" <= ch <= "9":
                value = (value << 4) + int(ch, 16)
            else:
                break
            pos += 1
        if pos != start + size:
            raise GrammarError(f"expecting {size} hex chars at {self._rest(start)}")
        return value, pos

    def parse_char(self, pos: int) -> tuple[int, int]:
        c = self._c(pos)
        if c == "\\":
            e = self._c(pos + 1)
            if e == "x":
                return self.parse_hex(pos + 2, 2)
            if e == "u":
                return self.parse_hex(pos + 2, 4)
            if e == "U":
                return self.parse_hex(pos + 2, 8)
            if e in _SIMPLE_ESCAPES:
                return ord(_SIMPLE_ESCAPES[e]), pos + 2
            raise GrammarError(f"unknown escape at {self._rest(pos)}")
        if c != "\0":
            return ord(c), pos + 1
        raise GrammarError("unexpected end of input")

    def parse_token(self, pos: int) -> tuple[int, int]:
        start = pos
        if self._c(pos) != "<":
            raise GrammarError(f"expecting '<' at {self._rest(pos)}")
        pos += 1
        if self._c(pos) == "[":  # <[id]>
            pos += 1
            end = self.parse_int(pos)
            token_id = int(self._src[pos:end])
            if token_id > 0xFFFFFFFF:
                raise GrammarError(f"parsed token id is too big at {self._rest(pos)}")
            pos = end
            if self._c(pos) != "]":
                raise GrammarError(f"expecting ']' at {self._rest(pos)}")
            pos += 1
            if self._c(pos) != ">":
                raise GrammarError(f"expecting '>' at {self._rest(pos)}")
            return token_id, pos + 1
        if self.tokenize is None:
            raise GrammarError(f"no vocab to parse token at {self._rest(start)}")
        while self._c(pos) not in ("\0", ">"):
            pos += 1
        if self._c(pos) != ">":
            raise GrammarError(f"expecting '>' at {self._rest(pos)}")
        pos += 1
        text = self._src[start:pos]
        tokens = self.tokenize(text)
        if len(tokens) != 1:
            raise GrammarError(f"invalid token '{text}'")
        return tokens[0], pos

    # ---- the grammar ------------------------------------------------------------------------

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int, is_nested: bool) -> int:
        rule: Rule = []
        pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        while self._c(pos) == "|":
            rule.append((GreType.ALT, 0))
            pos = self.parse_space(pos + 1, True)
            pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        rule.append((GreType.END, 0))
        self.add_rule(rule_id, rule)
        return pos

    def _repeat(self, rule: Rule, rule_name: str, last_sym_start: int, n_prev_rules: int,
                min_times: int, max_times: int, pos: int) -> int:
        """Rewrite the last symbol as llama.cpp's handle_repetitions does; returns the new n_prev_rules.

        S{m,n} -> S repeated m times, then S'(n-m) with S'(x) ::= S S'(x-1) | and S'(1) ::= S |;
        S{m,}  -> S repeated m times, then S' with S' ::= S S' |.
        """
        no_max = max_times == _UINT64_MAX
        if last_sym_start == len(rule):
            raise GrammarError(f"expecting preceding item to */+/?/{{ at {self._rest(pos)}")
        if not no_max and max_times < min_times:
            # llama.cpp's unsigned max - min wraps here and never ends; refuse it instead
            raise GrammarError(f"repetition maximum {max_times} is below its minimum {min_times} at {self._rest(pos)}")
        prev_rule = rule[last_sym_start:]
        total_rules = 1
        if not no_max and max_times > 0:
            total_rules = max_times
        elif min_times > 0:
            total_rules = min_times
        if n_prev_rules * total_rules > MAX_REPETITION_THRESHOLD:
            raise GrammarError("number of rules that are going to be repeated multiplied by the new repetition "
                               "exceeds sane defaults, please reduce the number of repetitions or rule complexity")
        if min_times == 0:
            del rule[last_sym_start:]
        else:
            for _ in range(1, min_times):
                rule.extend(prev_rule)
        last_rec_rule_id = 0
        n_opt = 1 if no_max else max_times - min_times
        for i in range(n_opt):
            rec_rule = list(prev_rule)
            rec_rule_id = self.generate_symbol_id(rule_name)
            if i > 0 or no_max:
                rec_rule.append((GreType.RULE_REF, rec_rule_id if no_max else last_rec_rule_id))
            rec_rule.append((GreType.ALT, 0))
            rec_rule.append((GreType.END, 0))
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            rule.append((GreType.RULE_REF, last_rec_rule_id))
        return n_prev_rules * total_rules

    def parse_sequence(self, pos: int, rule_name: str, rule: Rule, is_nested: bool) -> int:
        last_sym_start = len(rule)
        n_prev_rules = 1
        c = self._c
        while c(pos) != "\0":
            ch = c(pos)
            if ch == '"':  # literal string
                pos += 1
                last_sym_start = len(rule)
                n_prev_rules = 1
                while c(pos) != '"':
                    if c(pos) == "\0":
                        raise GrammarError("unexpected end of input")
                    cp, pos = self.parse_char(pos)
                    rule.append((GreType.CHAR, cp))
                pos = self.parse_space(pos + 1, is_nested)
            elif ch == "[":  # char class
                pos += 1
                start_type = GreType.CHAR
                if c(pos) == "^":
                    pos += 1
                    start_type = GreType.CHAR_NOT
                last_sym_start = len(rule)
                n_prev_rules = 1
                while c(pos) != "]":
                    if c(pos) == "\0":
                        raise GrammarError("unexpected end of input")
                    cp, pos = self.parse_char(pos)
                    rule.append((GreType.CHAR_ALT if last_sym_start < len(rule) else start_type, cp))
                    if c(pos) == "-" and c(pos + 1) != "]":
                        if c(pos + 1) == "\0":
                            raise GrammarError("unexpected end of input")
                        cp, pos = self.parse_char(pos + 1)
                        rule.append((GreType.CHAR_RNG_UPPER, cp))
                pos = self.parse_space(pos + 1, is_nested)
            elif ch in "<!":  # token, or inverse token
                kind = GreType.TOKEN
                if ch == "!":
                    kind = GreType.TOKEN_NOT
                    pos += 1
                token_id, end = self.parse_token(pos)
                last_sym_start = len(rule)
                n_prev_rules = 1
                rule.append((kind, token_id))
                pos = self.parse_space(end, is_nested)
            elif is_word_char(ch):  # rule reference
                end = self.parse_name(pos)
                ref = self.get_symbol_id(self._src[pos:end])
                pos = self.parse_space(end, is_nested)
                last_sym_start = len(rule)
                n_prev_rules = 1
                rule.append((GreType.RULE_REF, ref))
            elif ch == "(":  # group: nested alternates in a synthesized rule
                pos = self.parse_space(pos + 1, True)
                n_rules_before = len(self.symbol_ids)
                sub_rule_id = self.generate_symbol_id(rule_name)
                pos = self.parse_alternates(pos, rule_name, sub_rule_id, True)
                n_prev_rules = max(1, len(self.symbol_ids) - n_rules_before)
                last_sym_start = len(rule)
                rule.append((GreType.RULE_REF, sub_rule_id))
                if c(pos) != ")":
                    raise GrammarError(f"expecting ')' at {self._rest(pos)}")
                pos = self.parse_space(pos + 1, is_nested)
            elif ch == ".":  # any char
                last_sym_start = len(rule)
                n_prev_rules = 1
                rule.append((GreType.CHAR_ANY, 0))
                pos = self.parse_space(pos + 1, is_nested)
            elif ch in "*+?":
                pos = self.parse_space(pos + 1, is_nested)
                lo, hi = {"*": (0, _UINT64_MAX), "+": (1, _UINT64_MAX), "?": (0, 1)}[ch]
                n_prev_rules = self._repeat(rule, rule_name, last_sym_start, n_prev_rules, lo, hi, pos)
            elif ch == "{":
                pos = self.parse_space(pos + 1, is_nested)
                if not _is_digit(c(pos)):
                    raise GrammarError(f"expecting an int at {self._rest(pos)}")
                end = self.parse_int(pos)
                min_times = int(self._src[pos:end])
                pos = self.parse_space(end, is_nested)
                max_times = _UINT64_MAX
                if c(pos) == "}":
                    max_times = min_times
                    pos = self.parse_space(pos + 1, is_nested)
                elif c(pos) == ",":
                    pos = self.parse_space(pos + 1, is_nested)
                    if _is_digit(c(pos)):
                        end = self.parse_int(pos)
                        max_times = int(self._src[pos:end])
                        pos = self.parse_space(end, is_nested)
                    if c(pos) != "}":
                        raise GrammarError(f"expecting '}}' at {self._rest(pos)}")
                    pos = self.parse_space(pos + 1, is_nested)
                else:
                    raise GrammarError(f"expecting ',' at {self._rest(pos)}")
                if min_times > MAX_REPETITION_THRESHOLD:
                    raise GrammarError("number of repetitions exceeds sane defaults, please reduce the number of "
                                       "repetitions")
                if max_times != _UINT64_MAX and max_times > MAX_REPETITION_THRESHOLD:
                    max_times = _UINT64_MAX
                n_prev_rules = self._repeat(rule, rule_name, last_sym_start, n_prev_rules, min_times, max_times, pos)
            else:
                break
        return pos

    def parse_rule(self, pos: int) -> int:
        name_end = self.parse_name(pos)
        name = self._src[pos:name_end]
        p = self.parse_space(name_end, False)
        rule_id = self.get_symbol_id(name)
        if self._src[p:p + 3] != "::=":
            raise GrammarError(f"expecting ::= at {self._rest(p)}")
        p = self.parse_space(p + 3, True)
        p = self.parse_alternates(p, name, rule_id, False)
        ch = self._c(p)
        if ch == "\r":
            p += 2 if self._c(p + 1) == "\n" else 1
        elif ch == "\n":
            p += 1
        elif ch != "\0":
            raise GrammarError(f"expecting newline or end at {self._rest(p)}")
        return self.parse_space(p, True)

    def parse(self, src: str) -> None:
        """Parse ``src`` (up to a NUL, as the C string llama.cpp reads); raises GrammarError with
        llama.cpp's message ("error parsing grammar: ...")."""
        self._src = src.split("\0", 1)[0]
        try:
            pos = self.parse_space(0, True)
            while self._c(pos) != "\0":
                pos = self.parse_rule(pos)
            self._check_defined()
        except GrammarError as e:
            self.rules = []
            raise GrammarError(f"error parsing grammar: {e}") from None

    def _check_defined(self) -> None:
        """llama.cpp's validation: every rule defined, every reference to a defined rule."""
        for rule in self.rules:
            if not rule:
                raise GrammarError("Undefined rule")
            for kind, value in rule:
                if kind == GreType.RULE_REF and (value >= len(self.rules) or not self.rules[value]):
                    name = next(k for k, v in self.symbol_ids.items() if v == value)
                    raise GrammarError(f"Undefined rule identifier '{name}'")

    # ---- printing (llama_grammar_parser::print), for debugging and tests -------------------

    def format(self) -> str:
        names = {v: k for k, v in self.symbol_ids.items()}
        return "".join(_format_rule(names, i, r) for i, r in enumerate(self.rules))


def _char_text(c: int) -> str:
    return chr(c) if 0x20 <= c <= 0x7F else f"<U+{c:04X}>"


def _format_rule(names: dict[int, str], rule_id: int, rule: Rule) -> str:
    out = [f"{names[rule_id]} ::= "]
    for i, (kind, value) in enumerate(rule[:-1]):
        if kind == GreType.ALT:
            out.append("| ")
        elif kind == GreType.RULE_REF:
            out.append(f"{names[value]} ")
        elif kind == GreType.CHAR:
            out.append("[" + _char_text(value))
        elif kind == GreType.CHAR_NOT:
            out.append("[^" + _char_text(value))
        elif kind == GreType.CHAR_RNG_UPPER:
            out.append("-" + _char_text(value))
        elif kind == GreType.CHAR_ALT:
            out.append(_char_text(value))
        elif kind == GreType.CHAR_ANY:
            out.append(".")
        elif kind in (GreType.TOKEN, GreType.TOKEN_NOT):
            out.append(("!" if kind == GreType.TOKEN_NOT else "") + f"<[{value}]> ")
        if kind in _CHAR_KINDS and rule[i + 1][0] not in (GreType.CHAR_ALT, GreType.CHAR_RNG_UPPER, GreType.CHAR_ANY):
            out.append("] ")
    return "".join(out) + "\n"


_CHAR_KINDS = frozenset({GreType.CHAR, GreType.CHAR_NOT, GreType.CHAR_ALT, GreType.CHAR_RNG_UPPER, GreType.CHAR_ANY})
