"""granitemoe (src/models/granite-moe.cpp): granite's multipliers with a mixture of experts in every
layer (softmax router, renormalised weights) and, when the file sizes one, a shared expert added."""

from __future__ import annotations

from . import register
from .granite import Granite


@register
class GraniteMoE(Granite):
    name = "granitemoe"
