"""Positional schemes behind one interface (``PositionalScheme``), one file each, one registry.

A new scheme is one module in this package (a ``PositionalScheme`` subclass with ``@register``)
plus ``conf/posenc/<name>.yaml``: every module here is imported, so registering is discovering.

>>> from posenc_lab.positional import build_scheme, Dims, SCHEME_NAMES
>>> scheme = build_scheme("xl", Dims(n_layer=2, d_model=64, n_head=4), clamp_len=128)
"""

import importlib
import pkgutil

from .base import AttentionInputs, Dims, PositionalScheme, Positions, sinusoid_table
from .fused import IMPLS as ATTENTION_IMPLS
from .registry import SCHEMES, build_scheme, register, scheme_class, scheme_options, sized_options

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "positions", "registry", "fused", "drope"):  # the interface, not schemes
        importlib.import_module(f"{__name__}.{_module.name}")


def scheme_names() -> tuple[str, ...]:
    """Registered scheme names, sorted; a scheme registered after this package loaded (a module of a
    plugin or a test) is included."""
    return tuple(sorted(SCHEMES))


def schemes_of_kind(kind: str) -> tuple[str, ...]:
    """Registered scheme names of one kind ("absolute", "relative", "none"), sorted."""
    return tuple(name for name in scheme_names() if SCHEMES[name].kind == kind)


def __getattr__(name: str):
    if name == "SCHEME_NAMES":  # computed when asked: ``scheme_names()``
        return scheme_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATTENTION_IMPLS",
    "AttentionInputs",
    "Dims",
    "Positions",
    "PositionalScheme",
    "SCHEMES",
    "SCHEME_NAMES",
    "build_scheme",
    "register",
    "scheme_class",
    "scheme_options",
    "scheme_names",
    "schemes_of_kind",
    "sized_options",
    "sinusoid_table",
]
