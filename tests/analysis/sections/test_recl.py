"""The RECL section (posenc_lab_analysis.sections.recl): which cells it compares with and without memory."""

from __future__ import annotations

from posenc_lab_analysis.runs import Run, cells
from posenc_lab_analysis.sections.recl import _memory_pairs
from tests.schemes import SINUSOID


def test_memory_is_judged_within_a_cell_name_scheme_not_across_ssmax(tmp_path):
    """sinusoid and sinusoid+ssmax (model.softmax_scale=ssmax) are other models: each with memory pairs with its
    own run without memory, never with the other's."""

    def run(mem_len: int, scale: str | None) -> Run:
        model = {"mem_len": mem_len, "softmax_scale": scale}
        return Run(
            tmp_path / f"{mem_len}{scale}", {"posenc": {"name": SINUSOID}, "model": model, "data": {"name": "x"}}
        )

    grouped = cells([run(16, None), run(0, None), run(16, "ssmax"), run(0, "ssmax")])
    assert sorted(_memory_pairs(grouped)) == [
        (f"{SINUSOID}+ssmax:mem16", f"{SINUSOID}+ssmax:nomem"),
        (f"{SINUSOID}:mem16", f"{SINUSOID}:nomem"),
    ]
