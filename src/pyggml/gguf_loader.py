"""From a GGUF file to pyggml tensors: ggml's ``gguf_init_from_file`` with ``params.ctx`` set.

ggml makes one context holding every tensor of the file; unless ``no_alloc``, it also holds
an I8 tensor "GGUF tensor data binary blob" with the whole data section, and each tensor's
data points into it at the tensor's offset. This module does exactly that, with the same
memory accounting, so code ported from ggml finds the same context.

Why here and not in gguf/: gguf/ reads and writes bytes and metadata and knows nothing of
tensors or contexts (it sits below them, just above quants/). Building a Context of Tensors
from a reader needs both, so this module lives on the tensor/context layer, one above gguf/.
It is ggml's, not llama.cpp's (llm/model.py loads models its own way, into backend buffers),
which is why it is not in llm/.
"""

from __future__ import annotations

from . import memory
from .context import Context, tensor_overhead
from .gguf.errors import GGUFError
from .gguf.reader import GGUFReader
from .tensor import Tensor
from .types import GGMLType

BLOB_NAME = "GGUF tensor data binary blob"


def init_context(reader: GGUFReader, no_alloc: bool = False) -> Context:
    """A Context with one tensor per table entry, named as in the file (data copied unless ``no_alloc``)."""
    n = reader.n_tensors
    size = reader.data_size
    mem_size = n * tensor_overhead() if no_alloc else (n + 1) * tensor_overhead() + size
    ctx = Context(mem_size, no_alloc=no_alloc)
    blob_data: int | None = None
    if not no_alloc:
        blob = ctx.new_tensor_impl(GGMLType.I8, [size])
        blob.set_name(BLOB_NAME)
        if size:
            memory.region_view(blob.data, size)[:] = reader.data_section()
        blob_data = blob.data
    ctx.set_no_alloc(True)
    for ti in reader.tensors:
        t = ctx.new_tensor_impl(ti.type, list(ti.ne))
        t.set_name(ti.name)
        if blob_data is not None:
            t.data = blob_data + ti.offset
    ctx.set_no_alloc(no_alloc)
    return ctx


def load_tensor(ctx: Context, reader: GGUFReader, name: str) -> Tensor:
    """A new tensor in ``ctx`` with the file tensor's name, type and shape, its data copied in."""
    ti = reader.tensor_info(name)
    if ctx.get_no_alloc():
        raise GGUFError(f"cannot load tensor {name!r} into a no_alloc context", tensor=name)
    t = ctx.new_tensor_impl(ti.type, list(ti.ne))
    t.set_name(ti.name)
    if ti.nbytes:
        memory.region_view(t.data, ti.nbytes)[:] = reader.tensor_bytes(ti.name)
    return t
