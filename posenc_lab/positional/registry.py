"""One registry: scheme name -> class. A new scheme is one file plus ``@register``.

A scheme's options are the keyword-only arguments of its ``__init__``: their annotations are their types, checked
here for every scheme before it is built (``option_problem``), their defaults the Python API's (the same values as
``conf/posenc/<name>.yaml``, which training and the benchmark read: a test holds the two equal).
"""

from __future__ import annotations

import inspect
import types
import typing
from types import NoneType

from . import drope
from .base import Dims, PositionalScheme

SCHEMES: dict[str, type[PositionalScheme]] = {}
#: the option types a scheme may declare, with what a config must give for each (bool before int: a bool is an int)
TYPES = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list[float]: "a list of numbers",  # rope's longrope factors (each element checked)
    list: "a list",  # a hybrid's layers
    dict: "a mapping",  # a hybrid's options per scheme
}


def register(cls: type[PositionalScheme]) -> type[PositionalScheme]:
    if cls.name in SCHEMES:
        raise ValueError(f"positional scheme {cls.name!r} is registered twice")
    SCHEMES[cls.name] = cls
    return cls


def scheme_options(name: str) -> dict[str, object]:
    """The keyword options a scheme accepts, with their defaults."""
    params = inspect.signature(scheme_class(name).__init__).parameters
    return {p.name: p.default for p in params.values() if p.kind is p.KEYWORD_ONLY}


def option_types(name: str) -> dict[str, tuple[type, ...]]:
    """The types each keyword option of scheme ``name`` takes, read from its annotation (``int | None`` ->
    (int, NoneType)); an option without an annotation of these types is not listed."""
    hints = typing.get_type_hints(scheme_class(name).__init__)
    out = {}
    for option in scheme_options(name):
        hint = hints.get(option)
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        args = typing.get_args(hint) if union else (hint,)
        args = tuple(a if a in TYPES else typing.get_origin(a) or a for a in args)  # list[str] -> list
        if all(a in TYPES or a is NoneType for a in args):
            out[option] = args
    return out


def _is_of(value, kind: type) -> bool:
    """A bool is only a bool, an integer never a bool, a number an integer or a float; a list of numbers a list (or
    tuple) of them."""
    if typing.get_origin(kind) is list:
        return isinstance(value, (list, tuple)) and all(_is_of(v, typing.get_args(kind)[0]) for v in value)
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind)


def option_problem(name: str, option: str, value) -> str | None:
    """Why ``value`` is not of the type scheme ``name`` declares for ``option`` (its annotation), or None."""
    allowed = option_types(name).get(option)
    if allowed is None or (value is None and NoneType in allowed) or any(_is_of(value, t) for t in allowed):
        return None
    kinds = " or ".join(TYPES[t] if t in TYPES else "null" for t in allowed)
    return f"{name}: posenc.{option} must be {kinds}, got {value!r}"


def scheme_class(name: str) -> type[PositionalScheme]:
    if name not in SCHEMES:
        raise ValueError(f"unknown positional scheme {name!r}; valid schemes: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def sized_options(name: str, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
    """Scheme ``name``'s options with the length-dependent defaults (left None) sized to a run of these lengths."""
    return scheme_class(name).sized_options(dict(options), segment_len, mem_len, max_offset or 0)


def build_scheme(name: str, dims: Dims, **options) -> PositionalScheme:
    """Build scheme ``name`` for a model of ``dims``; unknown names or options, and values not of an option's
    type, fail with the valid ones, before the scheme is built. ``drop_at_step`` (any scheme): DroPE, drope.py."""
    drop = options.pop("drop_at_step", None)
    cls = scheme_class(name)
    if drop is not None:  # before the build: a bad step or a scheme that cannot drop costs nothing
        drope.check_option(name, drop)
        if (why := drope.refusal(cls)) is not None:
            raise ValueError(f"{name}: posenc.drop_at_step cannot apply: {why}")
    valid = scheme_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "none"
        raise ValueError(f"positional scheme {name!r} has no option(s) {unknown}; its options are: {listed}")
    for option, value in options.items():
        if (problem := option_problem(name, option, value)) is not None:
            raise ValueError(problem)
    scheme = cls(dims, **options)
    if drop is None:
        return scheme
    return drope.drop_at(scheme, drop)
