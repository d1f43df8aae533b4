"""Backend-level fusions: consecutive compiled nodes the plan runs as one record (ggml-cpu fuses RMS_NORM
and its MUL the same way; the others are what ggml's GPU backends fuse): nn.py's norm chains and
ROPE into the KV cache, gate_up.py's FFN products.

The graph keeps every node and a fused kernel writes every node's output with the bits of that node's own
kernel, so an eval callback, a later reader or a test sees the same tensors; what goes is a barrier and a
pass over memory per fused node. The plan (plan.py) offers each compiled node with the one before it; a
fused record may take in the next node again (ADD + RMS_NORM, then its MUL), and a fusion only a later node
completes (Choice.pending) goes back to its records when none does. The gate/up and ROPE fusions save about
1% of a decode step for seconds of compiling: they wait until their kernels are cached (jit.ready_or_wanted).
"""

from __future__ import annotations

from ....tensor import Tensor
from . import Choice, gate_up, nn


def fuse(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice) -> Choice | None:
    """The kernel computing ``prev`` (with its fused parts) and then ``node``, or None."""
    for rule in _RULES:
        fused = rule(prev, prev_choice, node, choice)
        if fused is not None:
            return fused
    return None


_RULES = (nn.fuse_norm, gate_up.fuse_gate_up, nn.fuse_rope_set_rows)


__all__ = ["fuse"]
