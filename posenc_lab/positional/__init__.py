"""Positional schemes behind one interface (``PositionalScheme``), one file each, one registry.

>>> from posenc_lab.positional import build_scheme, Dims, SCHEME_NAMES
>>> scheme = build_scheme("xl", Dims(n_layer=2, d_model=64, n_head=4), clamp_len=128)
"""

from .base import Dims, Positions, PositionalScheme, sinusoid_table
from .registry import SCHEMES, build_scheme, register, scheme_class, scheme_options

# Importing a scheme's module registers it.
from . import nope, sinusoid, learned, global_sinusoid, shaw, xl, rope, alibi, t5  # noqa: E402,F401

SCHEME_NAMES: tuple[str, ...] = tuple(SCHEMES)

__all__ = [
    "Dims",
    "Positions",
    "PositionalScheme",
    "SCHEMES",
    "SCHEME_NAMES",
    "build_scheme",
    "register",
    "scheme_class",
    "scheme_options",
    "sinusoid_table",
]
