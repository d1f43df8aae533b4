"""The op table (pyggml.ops.table) held to the code.

Fails when an Op/UnaryOp/GluOp has no row, a row names a builder that does not exist (in
``pyggml.ops.builders`` and the flat ``pyggml.*``), an op lacks a builder or a CPU kernel without
saying why, an op's builder and CPU kernel sit in families of different names
(``ops/<family>.py`` beside ``backend/cpu/ops/<family>.py``), the CPU or torch column disagrees
with what the backends really do, or a listed test module is missing or never mentions the op.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import numpy as np
import pytest

import pyggml
from helpers.data import TESTS
from helpers.opcheck import OpCase
from pyggml.backend.cpu.kernel_table import KERNELS
from pyggml.errors import PyGGMLError
from pyggml.ops import builders as B
from pyggml.ops.enums import EMPTY_OPS, GluOp, Op, UnaryOp
from pyggml.ops.table import OP_TABLE, ROWS, AnyOp, OpRow, _load, key, row
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

ALL_OPS: list[AnyOp] = [*Op, *UnaryOp, *GluOp]


def _id(r: OpRow) -> str:
    return f"{type(r.op).__name__}.{r.op.name}"


def _builder(r: OpRow, name: str) -> Callable[..., Tensor] | None:
    """A row's builder by name: in ops.builders, or (for leaves, Op.NONE) the flat API's constructors."""
    fn = getattr(B, name, None)
    if fn is None and r.op is Op.NONE:
        fn = getattr(pyggml, name, None)
    return fn


def test_every_op_has_exactly_one_row() -> None:
    keys = [key(r.op) for r in ROWS]
    assert len(keys) == len(set(keys)), "an op has two rows"
    missing = [f"{t}.{n}" for t, n in (key(op) for op in ALL_OPS) if (t, n) not in OP_TABLE]
    assert not missing, f"ops without a row in pyggml/ops/table.toml: {missing}"
    assert len(OP_TABLE) == len(ALL_OPS)


@pytest.mark.parametrize("r", ROWS, ids=_id)
def test_builders_exist_and_are_exported(r: OpRow) -> None:
    if not r.builders:
        assert r.why_not, f"{_id(r)} has no builder and the table does not say why"
        return
    for name in r.builders:
        fn = _builder(r, name)
        assert callable(fn), f"{_id(r)}: builder {name!r} is not in pyggml.ops.builders"
        assert callable(getattr(pyggml, name, None)), f"{_id(r)}: builder {name!r} is not exported as pyggml.{name}"
    if r.op is not Op.NONE:  # the module that defines the first builder records this op (or sub-op)
        fn = _builder(r, r.builders[0])
        src = inspect.getsource(inspect.getmodule(fn))  # type: ignore[arg-type]
        assert f"{type(r.op).__name__}.{r.op.name}" in src, f"{_id(r)}: {r.builders[0]} never names the op"


@pytest.mark.parametrize("op", list(Op), ids=lambda o: o.name)
def test_cpu_column_matches_the_kernel_registry(op: Op) -> None:
    r = row(op)
    assert r.cpu == (op in KERNELS), f"{op.name}: table says cpu={r.cpu}, the CPU registry says {op in KERNELS}"
    if not r.cpu:
        assert r.why_not, f"{op.name} has no CPU kernel and the table does not say why"
    if op in EMPTY_OPS:
        assert not r.cpu, f"{op.name} computes nothing; it needs no kernel"


def _family(fn: Callable[..., object]) -> str:
    return fn.__module__.rsplit(".", 1)[-1]


@pytest.mark.parametrize("r", [r for r in ROWS if r.builders and r.cpu], ids=_id)
def test_builder_and_kernel_share_a_family(r: OpRow) -> None:
    """PAD's builder is in ops/conv.py and its kernel in backend/cpu/ops/conv.py: one family name."""
    op = r.op if isinstance(r.op, Op) else (Op.UNARY if isinstance(r.op, UnaryOp) else Op.GLU)
    for name in r.builders:
        fn = _builder(r, name)
        assert fn is not None
        assert _family(fn) == _family(KERNELS[op]), (
            f"{_id(r)}: builder {name} is in ops/{_family(fn)}.py, "
            f"its kernel in backend/cpu/ops/{_family(KERNELS[op])}.py")


def test_why_not_is_only_given_where_something_is_missing() -> None:
    stale = [_id(r) for r in ROWS if r.why_not and r.builders and r.cpu]
    assert not stale, f"rows with a reason but nothing missing: {stale}"


def _sub_op_node(c: OpCase, op: UnaryOp | GluOp) -> Tensor:
    """A small F32 node of a unary or GLU sub-op, made by its row's first builder."""
    a = c.tensor(GGMLType.F32, 8, 2, lo=-2.0, hi=2.0)
    fn = _builder(row(op), row(op).builders[0])
    assert fn is not None
    if op is UnaryOp.XIELU:
        return fn(c.ctx, a, 0.8, 0.8, 0.5, 1e-6)
    if op is GluOp.SWIGLU_OAI:
        return fn(c.ctx, a, None, 1.702, 7.0)
    if op is GluOp.SWIGLU_CLAMP:
        return fn(c.ctx, a, None, 1.0)
    return fn(c.ctx, a)


@pytest.mark.parametrize("op", [*UnaryOp, *GluOp], ids=lambda o: f"{type(o).__name__}.{o.name}")
def test_sub_op_builder_records_it_and_cpu_column_is_true(op: UnaryOp | GluOp) -> None:
    c = OpCase(mem=1 << 20)
    node = _sub_op_node(c, op)
    assert node.op == (Op.UNARY if isinstance(op, UnaryOp) else Op.GLU)
    assert node.get_op_params_i32(0) == int(op), f"{row(op).builders[0]} records another sub-op"
    try:
        out = c.compute(node)
        computed = bool(np.isfinite(out).all())
    except PyGGMLError:
        computed = False
    assert row(op).cpu == computed, f"{op.name}: table says cpu={row(op).cpu}, the CPU backend computed={computed}"


def test_torch_column_matches_the_torch_backend() -> None:
    pytest.importorskip("torch", reason="the torch backend is the optional extra pyggml[torch]")
    from pyggml.backend.torch import SUPPORTED_OPS, supports_op

    wrong = [op.name for op in Op if row(op).torch != (op in SUPPORTED_OPS)]
    c = OpCase(mem=1 << 20)
    for op in [*UnaryOp, *GluOp]:
        if row(op).torch != supports_op(_sub_op_node(c, op)):
            wrong.append(f"{type(op).__name__}.{op.name}")
    assert not wrong, f"the torch column disagrees with pyggml.backend.torch for {wrong}"


def _mentions(text: str, r: OpRow) -> bool:
    """The op by enum (Op.ROLL), or one of its builders by attribute (B.roll, pyggml.roll) or name ("roll")."""
    pats = [rf"\b{type(r.op).__name__}\.{r.op.name}\b"]
    pats += [rf"\b(?:B|g|gg|pyggml|builders)\.{n}\b|[\"']{n}[\"']" for n in r.builders]
    return re.search("|".join(pats), text) is not None


@pytest.mark.parametrize("r", ROWS, ids=_id)
def test_listed_test_modules_exist_and_mention_the_op(r: OpRow) -> None:
    assert r.tests, f"{_id(r)} has no test module in the table"
    for name in r.tests:
        found = sorted(TESTS.rglob(f"test_{name}.py"))  # the test folders by layer: tests/ops, tests/backend, ...
        assert len(found) == 1, f"{_id(r)}: test_{name}.py does not exist (or exists twice) under tests/"
        path = found[0]
        assert _mentions(path.read_text(), r), f"{_id(r)}: {path.name} never mentions the op or its builders"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[why_not]\n[Opp]\nADD = { builders = "add", tests = "x" }', "unknown section [Opp]"),
        ('[why_not]\n[Op]\nADDD = { builders = "add", tests = "x" }', "Op.ADDD is not a member of Op"),
        ('[why_not]\n[Op]\nADD = { builders = "add", tests = "x", gpu = true }', "unknown fields ['gpu']"),
        ('[why_not]\n[Op]\nADD = { builders = "", tests = "x", why_not = "nope" }', "reason 'nope' missing"),
    ],
)
def test_table_file_errors_name_the_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "table.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        _load(path)
