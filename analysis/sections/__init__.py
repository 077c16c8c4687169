"""The report's sections, one module each, one registry (``SECTIONS``), as the positional schemes are.

A new section is one module in this package (a ``Section`` subclass with ``@register``: its settings, what it
measures, how it renders) plus its keys in conf/ablate.yaml (``ablate.analysis.<name>`` and its place in
``ablate.analysis.sections``, the report's one statement of order): every module here is imported, so registering
is discovering. The analyses measure (``dumps``, ``recl``, ``extrapolation``, ...); ``report.py`` holds what the
sections share (per-token dumps, evidence) and runs them in the stated order.
"""

import importlib
import pkgutil

from .base import CORPUS, RECALL, REPORT, SCOPES, SECTIONS, Figure, Part, Section, Table, register, render

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def section_class(name: str) -> type[Section]:
    """The registered section ``name``; ValueError naming the registered ones."""
    if name not in SECTIONS:
        raise ValueError(
            f"ablate.analysis.sections: {name!r} is not a registered section; the sections: {', '.join(SECTIONS)}"
        )
    return SECTIONS[name]


__all__ = [
    "CORPUS",
    "RECALL",
    "REPORT",
    "SCOPES",
    "SECTIONS",
    "Figure",
    "Part",
    "Section",
    "Table",
    "register",
    "render",
    "section_class",
]
