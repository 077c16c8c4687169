"""The report's last part: where its tables and figures are, and which runs it read."""

from __future__ import annotations

from .base import REPORT, Part, Section, register


@register
class Files(Section):
    name = "files"
    title = "Files"
    scope = REPORT
    numbered = False

    def render(self, ctx, measured: None) -> Part:
        return Part(
            "Every table is the CSV named in its caption (full precision); figures are the PNGs shown. "
            "Runs: " + ", ".join(f"`{r.path}`" for r in ctx.report.runs) + "."
        )
