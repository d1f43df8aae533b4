"""The i-quant codecs: importing this module registers IQ1_S/M, IQ2_XXS/XS/S, IQ3_XXS/S, IQ4_NL/XS."""

from . import iq2, iq3, iq4  # noqa: F401
