"""The op table: for every ggml op (``Op``), unary sub-op (``UnaryOp``) and GLU sub-op (``GluOp``),
its builders, whether the CPU and torch backends compute it, and the test modules that exercise it.

Like ggml's single ``enum ggml_op`` with a constructor per op, this is the one place to look up
where an op lives: its builders in ``pyggml/ops/<family>.py`` and its CPU kernel in
``pyggml/backend/cpu/kernels/<family>.py``, the same family name on both sides (elementwise,
unary, reduce, shape, rows, mat, nn, conv, recurrent, train, custom). tests/test_op_table.py
holds the table to the code: it fails when an op has no row, a listed builder is missing, its
builder and kernel sit in families of different names, a CPU kernel or torch support differs from
what the row says, or a listed test module does not mention the op. An op without a builder or a CPU kernel must
say why (``why_not``); nothing is skipped silently.

The rows themselves are a plain-text table, ops/table.txt, one aligned line per op: it is data, and
read as a table it is easier to scan and to edit than a hundred-odd constructor calls. This module
parses it at import (a malformed row fails the import, naming its line) into ``OpRow``s. The table
only names things (builders by function name, tests by module name): importing it loads no backend,
so the ops layer stays below the backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

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


#: why an op has no builder or no CPU kernel, by the name the table's last column gives
WHY_NOT = {
    "empty": "computes nothing (ggml_op_is_empty): a leaf or a view of its source, so no backend has a kernel",
    "flash_attn_back": "ggml_flash_attn_back GGML_ABORTs ('TODO: adapt to ggml_flash_attn_ext() changes') and no "
    "ggml backend implements FLASH_ATTN_BACK, so pyggml has neither a builder nor a kernel for it",
}
_ENUMS: dict[str, type[AnyOp]] = {"Op": Op, "UnaryOp": UnaryOp, "GluOp": GluOp}
_BACKENDS = {"cpu", "torch"}


def _words(cell: str) -> tuple[str, ...]:
    return () if cell == "-" else tuple(cell.split())


def _parse(text: str) -> tuple[OpRow, ...]:
    """The rows of table.txt; a malformed row fails the import, naming its line."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split("|")]
        try:
            op_name, builders, tests, backends, why = cells
            kind, member = op_name.split(".")
            op = _ENUMS[kind][member]
            on = set(_words(backends))
            if not on <= _BACKENDS or (why and why not in WHY_NOT):
                raise ValueError(cells)
        except (ValueError, KeyError) as e:
            raise ValueError(f"ops/table.txt line {n}: malformed row {line!r}") from e
        rows.append(OpRow(op, _words(builders), _words(tests), "cpu" in on, "torch" in on, WHY_NOT.get(why, "")))
    return tuple(rows)


ROWS: tuple[OpRow, ...] = _parse(resources.files(__package__).joinpath("table.txt").read_text())


def key(op: AnyOp) -> tuple[str, str]:
    """A row's key, ("Op", "ADD"): the enums are IntEnums, so Op.NONE == UnaryOp.ABS == GluOp.REGLU == 0
    and the members themselves cannot key one dict."""
    return type(op).__name__, op.name


#: the rows by key(op); every Op, UnaryOp and GluOp member has exactly one (checked by the test)
OP_TABLE: dict[tuple[str, str], OpRow] = {key(r.op): r for r in ROWS}


def row(op: AnyOp) -> OpRow:
    """The table row of ``op`` (KeyError for a member without one, which the op-table test forbids)."""
    return OP_TABLE[key(op)]
