"""The op table: for every ggml op (``Op``), unary sub-op (``UnaryOp``) and GLU sub-op (``GluOp``),
its builders, whether the CPU and torch backends compute it, and the test modules that exercise it.

Like ggml's single ``enum ggml_op`` with a constructor per op, this is the one place to look up
where an op lives: its builders in ``pyggml/ops/<family>.py`` and its CPU kernel in
``pyggml/backend/cpu/ops/<family>.py``, the same family name on both sides (elementwise,
unary, reduce, shape, rows, mat, nn, conv, recurrent, train, custom). tests/test_op_table.py
holds the table to the code: it fails when an op has no row, a listed builder is missing, its
builder and kernel sit in families of different names, a CPU kernel or torch support differs from
what the row says, or a listed test module does not mention the op. An op without a builder or a CPU kernel must
say why (``why_not``); nothing is skipped silently.

The rows themselves are data, in ``table.toml`` beside this module: one line an op, which reads as
a table and is edited as one. The table only names things (builders by function name, tests by
module name): loading it imports no backend, so the ops layer stays below the backends.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .enums import GluOp, Op, UnaryOp

AnyOp = Op | UnaryOp | GluOp


@dataclass(frozen=True)
class OpRow:
    """One op's row. ``builders`` are names in ``pyggml.ops.builders``, which gathers the family
    modules (``pyggml.*`` for leaf constructors); ``tests`` are module names (in any folder under tests/) without
    ``test_`` and ``.py``."""

    op: AnyOp
    builders: tuple[str, ...]
    tests: tuple[str, ...]
    cpu: bool = True
    torch: bool = False
    why_not: str = ""


def _load(path: Path) -> tuple[OpRow, ...]:
    """The rows of table.toml, in its order; a field, op or reason it does not know is an error naming it."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    reasons: dict[str, str] = data.pop("why_not", {})
    enums: dict[str, type[Op] | type[UnaryOp] | type[GluOp]] = {"Op": Op, "UnaryOp": UnaryOp, "GluOp": GluOp}
    rows = []
    for section, entries in data.items():
        if section not in enums:
            raise ValueError(f"{path.name}: unknown section [{section}]")
        for name, fields in entries.items():
            if name not in enums[section].__members__:
                raise ValueError(f"{path.name}: {section}.{name} is not a member of {section}")
            unknown = set(fields) - {"builders", "tests", "cpu", "torch", "why_not"}
            if unknown:
                raise ValueError(f"{path.name}: {section}.{name} has unknown fields {sorted(unknown)}")
            why = fields.get("why_not", "")
            if why and why not in reasons:
                raise ValueError(f"{path.name}: {section}.{name} names a reason {why!r} missing from [why_not]")
            rows.append(OpRow(enums[section][name], tuple(fields["builders"].split()), tuple(fields["tests"].split()),
                              fields.get("cpu", True), fields.get("torch", False), reasons.get(why, "")))
    return tuple(rows)


ROWS: tuple[OpRow, ...] = _load(Path(__file__).with_name("table.toml"))


def key(op: AnyOp) -> tuple[str, str]:
    """A row's key, ("Op", "ADD"): the enums are IntEnums, so Op.NONE == UnaryOp.ABS == GluOp.REGLU == 0
    and the members themselves cannot key one dict."""
    return type(op).__name__, op.name


#: the rows by key(op); every Op, UnaryOp and GluOp member has exactly one (checked by the test)
OP_TABLE: dict[tuple[str, str], OpRow] = {key(r.op): r for r in ROWS}


def row(op: AnyOp) -> OpRow:
    """The table row of ``op`` (KeyError for a member without one, which the op-table test forbids)."""
    return OP_TABLE[key(op)]
