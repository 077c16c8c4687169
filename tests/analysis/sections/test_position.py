"""Loss by position in the segment (analysis/sections/position.py): on planted per-token losses with a known
position effect, the per-position means, the gap between the first and last quarter and its interval come out
right, and the preregistered verdict of conf/paper.yaml is reproduced on a planted effect and not on a null."""

from __future__ import annotations

import re

import numpy as np
import pytest

from posenc_lab.cellnames import CellName
from posenc_lab.errors import ConfigError
from posenc_lab_analysis.sections.position import (
    CellPositions,
    Position,
    gap_share,
    gap_values,
    measure_positions,
    segment_positions,
)
from posenc_lab_analysis.sections.verdicts import _sentence
from posenc_lab_analysis.settings import structured
from posenc_lab_analysis.verdicts import DEFECT, HOLDS, NOT_TESTED, judge, paper

L, T, N_TOKENS, ROWS = 16, 64, 256, 32
SHARE = 0.25  # q = 4: positions 0-3 against 12-15


def effect(slope: float) -> np.ndarray:
    """[L] the planted position effect: slope at position 0, falling linearly to 0 at L - 1."""
    return slope * (1 - np.arange(L) / (L - 1))


def planted_gap(slope: float) -> float:
    e = effect(slope)
    return float(e[:4].mean() - e[-4:].mean())  # 0.8 slope


def planted(rng, slope: float, key: CellName, seeds: int = 3, text=None, episode_len: int = T) -> CellPositions:
    """Per-token losses of one cell: a text difficulty shared by every cell (``text``: [rows, n]), a seed effect,
    the position effect with a unit-to-unit spread of its slope, and token noise. Two rows a unit."""
    position, counted = segment_positions(N_TOKENS, L, episode_len)
    units = np.repeat(np.arange(ROWS // 2), 2)
    slopes = slope + rng.normal(0, 0.05, ROWS // 2)[units]  # [rows] each unit its own slope, mean ``slope``
    loss = (
        2.0
        + (0 if text is None else text)
        + rng.normal(0, 0.01, (seeds, 1, 1))
        + slopes[:, None] * (1 - position / (L - 1))
        + rng.normal(0, 0.3, (seeds, ROWS, N_TOKENS))
    )
    shape = (ROWS, N_TOKENS)
    return CellPositions(
        loss.reshape(seeds, -1),
        np.broadcast_to(position, shape).ravel(),
        np.broadcast_to(counted, shape).ravel(),
        np.broadcast_to(units[:, None], shape).ravel(),
        L,
        key,
    )


def pair(seed: int, nomem_slope: float, mem_slope: float, episode_len: int = T) -> dict[str, CellPositions]:
    rng = np.random.default_rng(seed)
    text = rng.normal(0, 0.2, (ROWS // 2, 1))[np.repeat(np.arange(ROWS // 2), 2)]  # per unit, shared by the cells
    return {
        "xl:mem16": planted(rng, mem_slope, CellName("xl", 16), text=text, episode_len=episode_len),
        "xl:nomem": planted(rng, nomem_slope, CellName("xl", 0), text=text, episode_len=episode_len),
    }


def test_positions_follow_the_stream_schedule_and_count_full_segments_with_memory():
    """Segments of 16 in episodes of 40: 0-15 (starts an episode), 16-31, 32-39 (cut by the episode's end), 40-55
    (a new episode), 56-71, 72-79 (cut), 80-95 (a new episode), 96-99 (the stream's end)."""
    position, counted = segment_positions(100, 16, 40)
    assert position[:40].tolist() == [*range(16), *range(16), *range(8)]
    assert position[96:].tolist() == [0, 1, 2, 3]
    assert np.flatnonzero(counted).tolist() == [*range(16, 32), *range(56, 72)]
    position, counted = segment_positions(64, 16, None)  # no episodes: only the stream's first segment is left out
    assert (position == np.tile(np.arange(16), 4)).all() and np.flatnonzero(counted).tolist() == list(range(16, 64))


def test_the_gap_values_average_to_the_gap_seed_by_seed():
    cell = pair(0, 0.4, 0.1)["xl:nomem"]
    v, selected = gap_values(cell, SHARE)
    first = cell.counted & (cell.position < 4)
    last = cell.counted & (cell.position >= 12)
    assert (selected == (first | last)).all()
    direct = cell.loss[:, first].mean(1) - cell.loss[:, last].mean(1)
    assert np.allclose(v.mean(1), direct, atol=1e-12)


def test_per_position_means_and_the_gap_recover_a_planted_effect():
    m = measure_positions(pair(1, 0.4, 0.1), SHARE, 0.95, 1.0, 4)
    for name, slope in (("xl:nomem", 0.4), ("xl:mem16", 0.1)):
        t = m.table[m.table["cell"] == name].reset_index(drop=True)
        assert (
            t["position"].tolist() == list(range(L)) and (t["tokens"] == ROWS * 12).all()
        )  # 3 of 4 segments, 4 episodes
        cell = pair(1, 0.4, 0.1)[name]
        for p in range(L):  # the mean at a position is that of its tokens, seed means alike
            at = cell.counted & (cell.position == p)
            assert t.at[p, "mean"] == pytest.approx(cell.loss[:, at].mean(), abs=1e-12)
        covered = ((t["low"] <= 2 + effect(slope)) & (2 + effect(slope) <= t["high"])).sum()
        assert covered >= 14  # of 16 positions, 95% intervals
        gap = m.gaps[name]
        assert gap.low < planted_gap(slope) < gap.high and gap.high - gap.low < 0.2
    twin, change = m.changes["xl:mem16"]
    assert twin == "xl:nomem" and change.low < planted_gap(0.1) - planted_gap(0.4) < change.high < 0
    columns = ["cell", "seeds", "pos 0-3", "pos 4-7", "pos 8-11", "pos 12-15", "gap_first_last", "memory_change"]
    assert list(m.summary.columns) == columns and m.ends == {"xl:mem16": (4, 16), "xl:nomem": (4, 16)}


def test_a_planted_zero_gap_gives_an_interval_covering_zero_at_its_nominal_rate():
    """200 planted groups without a position effect: the gap's interval (units and seeds) covers 0 in about 95%
    of them, and the change by memory too: the linearized values carry the unit-to-unit spread of the gap."""
    gaps, changes = [], []
    for seed in range(200):
        m = measure_positions(pair(seed, 0.0, 0.0), SHARE, 0.95, 1.0, 4)
        gaps.append(m.gaps["xl:nomem"].low < 0 < m.gaps["xl:nomem"].high)
        changes.append(m.changes["xl:mem16"][1].low < 0 < m.changes["xl:mem16"][1].high)
    assert 0.9 <= np.mean(gaps) <= 0.99 and 0.9 <= np.mean(changes) <= 0.99


def verdict_of(cells: dict[str, CellPositions]):
    spec = next(v for v in paper()["controls"] if v["id"] == "memory_narrows_fragmentation")  # by construction
    m = measure_positions(cells, gap_share(paper()), 0.95, 1.0, 4)
    _, controls = judge({"alpha": 0.05, "controls": [spec]}, {"position_gap": m.evidence})
    return controls[0]


def test_the_preregistered_control_holds_on_a_planted_effect_and_not_on_a_null():
    assert gap_share(paper()) == SHARE  # conf/paper.yaml's, fixed with the control
    v = verdict_of(pair(2, 0.4, 0.1))
    assert v.status == HOLDS and len(v.comparisons) == 2, (v.status, v.note)
    assert [c.text for c in v.comparisons] == ["xl:nomem", "xl:mem16 - xl:nomem"]
    line = _sentence(v, 1.0, "nats")  # the comparison that predicts the other side says so
    assert re.search(
        r"xl:nomem \+0\.\d+ \[\+0\.\d+, \+0\.\d+\], predicted >0 \+0; xl:mem16 - xl:nomem -0\.\d+ \[", line
    )
    assert verdict_of(pair(3, 0.0, 0.0)).status == DEFECT  # no gap at all: the run is broken
    assert verdict_of(pair(4, 0.4, 0.4)).status == DEFECT  # a gap that memory does not narrow


def test_a_cell_on_other_tokens_is_named_not_compared():
    cells = {**pair(5, 0.4, 0.1), "shaw:nomem": pair(6, 0.4, 0.1)["xl:nomem"]}
    cells["shaw:nomem"].key = CellName("shaw", 0)
    other = cells["xl:mem16"]
    position, counted = segment_positions(N_TOKENS, 8, T)  # another segment length: other ends
    shape = (ROWS, N_TOKENS)
    cells["xl:mem16"] = CellPositions(
        other.loss,
        np.broadcast_to(position, shape).ravel(),
        np.broadcast_to(counted, shape).ravel(),
        other.units,
        8,
        other.key,
    )
    m = measure_positions(cells, SHARE, 0.95, 1.0, 4)
    assert set(m.evidence.cells) == {"xl:nomem", "shaw:nomem"}  # the tokens most cells share
    assert "another segment length" in m.evidence.unavailable["xl:mem16"] and "xl:mem16" not in m.changes
    assert np.isfinite(m.gaps["xl:mem16"].estimate)  # its own gap, on its own ends


@pytest.mark.parametrize("share", [0, 0.6, "a quarter", None])
def test_a_bad_share_in_paper_yaml_is_one_line_naming_it(share):
    with pytest.raises(ConfigError, match=r"^conf/paper\.yaml: position_gap\.share must be a number in \(0, 0\.5\]"):
        gap_share({"position_gap": {"share": share}})


def test_a_bad_bins_setting_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"ablate\.analysis\.position\.bins must be an integer >= 1, got 0"):
        structured(Position.Settings, {"bins": 0}, "ablate.analysis.position")


def test_episodes_of_one_segment_leave_no_position_to_read_and_say_why():
    """Every segment starts an episode (T = L): a memory cell never has its memory, so nothing is compared; the
    section says why and the verdict is not tested (no crash, no number)."""
    cells = pair(7, 0.4, 0.1, episode_len=L)
    m = measure_positions(cells, SHARE, 0.95, 1.0, 4)
    assert m.table.empty and m.summary.empty and not m.gaps and set(m.skipped) == set(cells)
    assert all("no full segment that does not start an episode" in why for why in m.skipped.values())
    v = verdict_of(cells)
    assert v.status == NOT_TESTED and "no full segment" in v.note
