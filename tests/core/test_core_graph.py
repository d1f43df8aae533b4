"""Graph building: post-order, de-duplication, use counts, ggml's naming, flags, size limits."""

import pytest

import pyggml as gg
from pyggml import GGMLType as T
from pyggml.errors import GraphFullError
from pyggml.tensor import TensorFlag


@pytest.fixture
def ctx():
    return gg.init(64 * 1024 * 1024, no_alloc=True)


def _edges(g):
    for n in g.nodes:
        for s in n.src:
            if s is not None:
                yield s, n


def test_shared_subexpression_appears_once_and_use_counts(ctx):
    a = gg.new_tensor_1d(ctx, T.F32, 4)
    b = gg.new_tensor_1d(ctx, T.F32, 4)
    s = gg.add(ctx, a, b)
    p = gg.mul(ctx, s, s)  # s used twice by one node
    q = gg.sub(ctx, p, s)
    g = gg.new_graph(ctx)
    gg.build_forward_expand(g, q)
    assert g.nodes == [s, p, q] and g.leafs == [a, b]
    counts = {}
    for src, _ in _edges(g):
        counts[id(src)] = counts.get(id(src), 0) + 1
    for t in (a, b, s, p, q):
        assert g.use_count(t) == counts.get(id(t), 0)
    assert g.use_count(s) == 3 and g.use_count(q) == 0


def test_topological_order_and_names(ctx):
    x = gg.new_tensor_2d(ctx, T.F32, 8, 2)
    w = gg.new_tensor_2d(ctx, T.F32, 8, 8).set_name("w")
    h = gg.mul_mat(ctx, w, x)
    y = gg.soft_max(ctx, gg.scale(ctx, h, 0.5))
    g = gg.new_graph(ctx)
    gg.build_forward_expand(g, y)
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    for src, n in _edges(g):
        if id(src) in pos:
            assert pos[id(src)] < pos[id(n)]
    # ggml's scheme: unnamed leafs leaf_%d and nodes node_%d in order of insertion, names kept
    assert [t.name for t in g.leafs] == ["w", "leaf_1"]
    assert [t.name for t in g.nodes] == ["node_0", "node_1", "node_2"]
    assert g.nodes[-1] is y
    assert all(n.flags & TensorFlag.COMPUTE for n in g.nodes)
    assert not any(t.flags & TensorFlag.COMPUTE for t in g.leafs)


def test_expand_twice_adds_only_new_nodes(ctx):
    a = gg.new_tensor_1d(ctx, T.F32, 4)
    b = gg.sqr(ctx, a)
    c = gg.sqrt(ctx, b)
    g = gg.new_graph(ctx)
    gg.build_forward_expand(g, b)
    gg.build_forward_expand(g, c)
    gg.build_forward_expand(g, c)
    assert g.nodes == [b, c] and g.use_count(b) == 1


def test_param_tensor_is_a_node(ctx):
    x = gg.new_tensor_1d(ctx, T.F32, 1)
    gg.set_param(x)
    g = gg.new_graph(ctx)
    gg.build_forward_expand(g, gg.sqr(ctx, x))
    assert g.nodes[0] is x and g.n_leafs == 0


def test_100k_chain_builds_without_recursion(ctx):
    n = 100_000
    big = gg.init(n * gg.tensor_overhead() + gg.graph_overhead_custom(n + 1) + 4096, no_alloc=True)
    t = gg.new_tensor_1d(big, T.F32, 1)
    for _ in range(n):
        t = gg.sqr(big, t)
    g = gg.new_graph_custom(big, n + 1)
    gg.build_forward_expand(g, t)
    assert g.n_nodes == n and g.n_leafs == 1 and g.nodes[-1] is t
    assert g.nodes[0].src[0] is g.leafs[0]


def test_graph_full(ctx):
    t = gg.new_tensor_1d(ctx, T.F32, 1)
    for _ in range(5):
        t = gg.sqr(ctx, t)
    g = gg.new_graph_custom(ctx, 4)
    with pytest.raises(GraphFullError, match="graph is full"):
        gg.build_forward_expand(g, t)


def test_forward_select_flags_only_selected_branch(ctx):
    src = gg.new_tensor_1d(ctx, T.F32, 1)
    chain = [gg.scale(ctx, src, 1.0)]
    chain.append(gg.scale(ctx, chain[-1], 1.0))
    alt = gg.scale(ctx, src, 2.0)
    g = gg.new_graph(ctx)
    assert gg.build_forward_select(g, [chain[-1], alt], 1) is alt
    assert g.nodes == [*chain, alt]
    assert not any(n.flags & TensorFlag.COMPUTE for n in chain)
    assert alt.flags & TensorFlag.COMPUTE
    gg.build_forward_expand(g, chain[-1])  # revisiting propagates COMPUTE without new edges
    assert all(n.flags & TensorFlag.COMPUTE for n in chain) and g.use_count(src) == 2


def test_graph_view_and_dump(ctx, tmp_path, capsys):
    a = gg.new_tensor_1d(ctx, T.F32, 4)
    b = gg.sqr(ctx, gg.sqr(ctx, gg.sqr(ctx, a)))
    g = gg.new_graph(ctx)
    gg.build_forward_expand(g, b)
    v = gg.graph_view(g, 1, 3)
    assert v.nodes == g.nodes[1:3] and v.n_leafs == 0 and v.uid == 0 and g.uid > 0
    g.print()
    out = capsys.readouterr().out
    assert "n_nodes = 3" in out and "SQR" in out
    path = tmp_path / "g.dot"
    g.dump_dot(str(path))
    text = path.read_text()
    assert text.startswith("digraph G {") and text.count("->") == 3


def test_builder_shape_and_type_errors(ctx):
    a = gg.new_tensor_2d(ctx, T.F32, 4, 3)
    with pytest.raises(gg.ShapeError, match="broadcast"):
        gg.add(ctx, a, gg.new_tensor_1d(ctx, T.F32, 3))
    with pytest.raises(gg.ShapeError, match="MUL_MAT"):
        gg.mul_mat(ctx, a, gg.new_tensor_2d(ctx, T.F32, 5, 3))
    with pytest.raises(gg.TypeMismatchError, match="I32"):
        gg.get_rows(ctx, a, gg.new_tensor_1d(ctx, T.F32, 2))
    with pytest.raises(gg.ShapeError, match="contiguous"):
        gg.reshape_1d(ctx, gg.transpose(ctx, a), 12)
    with pytest.raises(gg.ShapeError, match="permutation"):
        gg.permute(ctx, a, 0, 0, 1, 2)
    with pytest.raises(gg.TypeMismatchError, match="same type"):
        gg.concat(ctx, a, gg.new_tensor_2d(ctx, T.F16, 4, 3), 1)
    with pytest.raises(gg.ShapeError, match="mask"):
        gg.soft_max_ext(ctx, a, gg.new_tensor_2d(ctx, T.F32, 5, 3), 1.0, 0.0)
    with pytest.raises(gg.ShapeError, match="positions"):
        gg.rope_ext(ctx, gg.new_tensor_3d(ctx, T.F32, 8, 2, 3), gg.new_tensor_1d(ctx, T.I32, 2), None,
                    8, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
