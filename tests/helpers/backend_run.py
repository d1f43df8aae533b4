"""Run one small graph on any backend, with inputs uploaded through the backend API.

Shared by the torch-backend and scheduler tests: inputs live in a buffer of the backend under
test (uploaded with backend_tensor_set, as a model's weights are), the graph is planned by a
graph allocator for that backend's buffer type, and the result is read back with
backend_tensor_get, so nothing here touches device memory directly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pyggml import quants
from pyggml.alloc import backend_alloc_ctx_tensors, gallocr_alloc_graph, gallocr_new, gallocr_reserve
from pyggml.backend import api
from pyggml.backend.base import Backend, BufferUsage
from pyggml.context import Context
from pyggml.graph import Graph, new_graph
from pyggml.tensor import Tensor
from pyggml.tensor_data import f32_to_bf16
from pyggml.types import GGMLType

#: name -> (type, ne, values as float/int array with the tensor's numpy shape)
Inputs = dict[str, tuple[GGMLType, list[int], np.ndarray]]
Builder = Callable[[Context, dict[str, Tensor]], Tensor]


def to_bytes(ty: GGMLType, values: np.ndarray, ne0: int) -> np.ndarray:
    """The bytes ggml stores for ``values`` in type ``ty`` (quantized per row of ne0)."""
    v = np.asarray(values)
    if ty == GGMLType.F32:
        return v.astype(np.float32).reshape(-1).view(np.uint8)
    if ty == GGMLType.F16:
        return v.astype(np.float16).reshape(-1).view(np.uint8)
    if ty == GGMLType.BF16:
        return f32_to_bf16(v.astype(np.float32).reshape(-1)).view(np.uint8)
    if ty == GGMLType.I32:
        return v.astype(np.int32).reshape(-1).view(np.uint8)
    if ty == GGMLType.I64:
        return v.astype(np.int64).reshape(-1).view(np.uint8)
    return quants.quantize(v.astype(np.float32).reshape(-1, ne0), ty).reshape(-1)


def from_bytes(t: Tensor, raw: np.ndarray) -> np.ndarray:
    ne = t.ne
    shape = (ne[3], ne[2], ne[1], ne[0])
    dtypes = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32}
    return raw.view(dtypes[t.type]).reshape(shape).astype(np.float32)


def upload_inputs(backend: Backend, inputs: Inputs, usage: BufferUsage = BufferUsage.WEIGHTS
                  ) -> tuple[Context, dict[str, Tensor]]:
    """Create the inputs in a buffer of ``backend`` and upload their values."""
    ctx = Context(1 << 20, no_alloc=True)
    tensors = {}
    for name, (ty, ne, _) in inputs.items():
        tensors[name] = ctx.new_tensor(ty, *ne).set_name(name)
    buf = backend_alloc_ctx_tensors(ctx, backend)
    assert buf is not None
    buf.set_usage(usage)
    for name, (ty, ne, values) in inputs.items():
        api.backend_tensor_set(tensors[name], to_bytes(ty, values, ne[0]))
    return ctx, tensors


def read(t: Tensor) -> np.ndarray:
    """A tensor's values as float32 (shape ne3, ne2, ne1, ne0), read through the backend API."""
    if t.is_contiguous():
        return from_bytes(t, api.backend_tensor_get(t))
    raise AssertionError(f"read() needs a contiguous tensor, {t.name!r} is not")


def run_graph(backend: Backend, inputs: Inputs, build: Builder) -> np.ndarray:
    """Build ``build(ctx, inputs)`` and compute it on ``backend`` alone; the result as float32."""
    _, tensors = upload_inputs(backend, inputs)
    ctx = Context(1 << 20, no_alloc=True)
    out = build(ctx, tensors)
    out.set_output()
    gf: Graph = new_graph(ctx)
    gf.build_forward_expand(out)
    galloc = gallocr_new(backend.get_default_buffer_type())
    assert gallocr_reserve(galloc, gf)
    assert gallocr_alloc_graph(galloc, gf)
    status = api.backend_graph_compute(backend, gf)
    assert status == 0
    return read(out)


