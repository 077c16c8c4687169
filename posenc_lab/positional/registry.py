"""One registry: scheme name -> class. A new scheme is one file plus ``@register``."""

from __future__ import annotations

import inspect

from .base import Dims, PositionalScheme

SCHEMES: dict[str, type[PositionalScheme]] = {}


def register(cls: type[PositionalScheme]) -> type[PositionalScheme]:
    if cls.name in SCHEMES:
        raise ValueError(f"positional scheme {cls.name!r} is registered twice")
    SCHEMES[cls.name] = cls
    return cls


def scheme_options(name: str) -> dict[str, object]:
    """The keyword options a scheme accepts, with their defaults."""
    params = inspect.signature(scheme_class(name).__init__).parameters
    return {p.name: p.default for p in params.values() if p.kind is p.KEYWORD_ONLY}


def scheme_class(name: str) -> type[PositionalScheme]:
    if name not in SCHEMES:
        raise ValueError(f"unknown positional scheme {name!r}; valid schemes: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def sized_options(name: str, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
    """Scheme ``name``'s options with the length-dependent defaults (left None) sized to a run of these lengths."""
    return scheme_class(name).sized_options(dict(options), segment_len, mem_len, max_offset or 0)


def build_scheme(name: str, dims: Dims, **options) -> PositionalScheme:
    """Build scheme ``name`` for a model of ``dims``; unknown names or options fail with the valid ones."""
    cls = scheme_class(name)
    valid = scheme_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "none"
        raise ValueError(f"positional scheme {name!r} has no option(s) {unknown}; its options are: {listed}")
    return cls(dims, **options)
