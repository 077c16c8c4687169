"""One naming rule for cells (posenc_lab/cellnames.py): the names users see stay valid, one parser reads what one
formatter writes, and a cell trained with any recent-loss fraction can be named in conf/paper.yaml and in
ablate.extra_seed_cells."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from posenc_lab.ablate.plan import RunSpec, plan, seeds_by_cell
from posenc_lab.cellnames import CellName, CellPattern, HasCell, scheme_label
from posenc_lab.compose import compose
from posenc_lab.positional import schemes_of_kind
from posenc_lab_analysis.runs import Run
from posenc_lab_analysis.verdicts import REPRODUCED, Evidence, judge
from tests.schemes import HYBRID, NOPE, ROPE, SHAW, SINUSOID, XL


@pytest.mark.parametrize(
    "cell, text",
    [
        (CellName(XL, 32), f"{XL}:mem32"),
        (CellName(XL, 0), f"{XL}:nomem"),
        (CellName(XL, 0, window=64), f"{XL}:win64"),
        (CellName(XL, 32, 0.5), f"{XL}:mem32:half"),
        (CellName(XL, 32, 0.3), f"{XL}:mem32:recent0.3"),
        (CellName(XL, 16, group="recall"), f"recall/{XL}:mem16"),
        (CellName(scheme_label(SINUSOID, 256), 0, group="reverse"), f"reverse/{SINUSOID}+rand256:nomem"),
    ],
)
def test_the_formatter_writes_the_names_users_see_and_the_parser_reads_them_back(cell, text):
    assert str(cell) == text and CellName.parse(text) == cell and CellPattern.parse(text).matches(cell)


def test_a_pattern_leaves_parts_open():
    cells = [CellName(XL, 32), CellName(XL, 64), CellName(XL, 0), CellName(XL, 32, 0.5), CellName(SHAW, 32)]
    cells += [CellName(s, 32) for s in schemes_of_kind("absolute")] + [CellName(XL, 16, group="recall")]

    def names(pattern):
        return [str(c) for c in cells if CellPattern.parse(pattern).matches(c)]

    assert names(f"{XL}:mem") == [f"{XL}:mem32", f"{XL}:mem64"]  # any memory length, the full loss
    assert names(f"{XL}:mem:half") == [f"{XL}:mem32:half"] and names(f"{XL}:mem:recent0.5") == [f"{XL}:mem32:half"]
    assert names(f"{XL}:mem32:*") == [f"{XL}:mem32", f"{XL}:mem32:half"]
    assert names(XL) == [f"{XL}:mem32", f"{XL}:mem64", f"{XL}:nomem"]  # with or without memory
    assert names("absolute:mem") == [f"{s}:mem32" for s in schemes_of_kind("absolute")]
    assert (
        len(names("*:mem")) == 3 + len(schemes_of_kind("absolute"))
        and f"{XL}:nomem" not in names("*:mem")
        and names("recall/*") == [f"recall/{XL}:mem16"]
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (f"{XL}:memory", "is not a cell"),
        (f"{XL}:mem0", "is not a cell"),
        (f"{XL}:mem:quarter", "is not a cell"),
        (f"{XL}:mem:recent1.5", "a recent-loss fraction is in (0, 1), got 1.5"),
        (f"{XL}:mem32:half:x", "is not a cell"),
    ],
)
def test_a_bad_name_is_one_line_with_the_grammar(text, message):
    with pytest.raises(ValueError, match=r"^paper: .*" + message.replace("(", r"\(").replace(")", r"\)")) as e:
        CellPattern.parse(text, "paper")
    assert "\n" not in str(e.value)


def test_a_name_names_one_cell():
    with pytest.raises(ValueError, match="names several cells"):
        CellName.parse(f"{XL}:mem")
    with pytest.raises(ValueError, match="names several cells"):
        CellName.parse(f"{XL}:win")
    with pytest.raises(ValueError, match="is not a cell"):
        CellName.parse(f"{XL}:win0")


def test_a_window_cell_is_matched_only_by_a_pattern_that_names_win():
    """xl:win64 (no memory, trained at L + M) is another cell than xl:nomem: `xl:nomem`, `xl` and `*` leave it
    out, so the verdicts written before it existed keep their cells; `xl:win` and `xl:win64` name it."""
    cells = [CellName(XL, 32), CellName(XL, 0), CellName(XL, 0, window=64), CellName(SHAW, 32)]

    def names(pattern):
        return [str(c) for c in cells if CellPattern.parse(pattern).matches(c)]

    assert names(f"{XL}:win") == names(f"{XL}:win64") == [f"{XL}:win64"] and names(f"{XL}:win32") == []
    assert names(f"{XL}:nomem") == [f"{XL}:nomem"] and names(XL) == [f"{XL}:mem32", f"{XL}:nomem"]
    assert f"{XL}:win64" not in names("*") and names("*:win") == [f"{XL}:win64"]
    assert str(CellPattern.parse(f"{XL}:win")) == f"{XL}:win" and str(CellPattern.parse("*:win64")) == "*:win64"


def test_the_default_preset_plans_a_window_of_the_same_span_read_back_under_its_cell(tmp_path):
    """ablate.same_span: xl without memory at segment L + M = 64, the batch halved (the same tokens a step), 3
    seeds (extra_seed_cells), its run folder and the run it trains under one cell, xl:win64; a batch that cannot be
    cut evenly is refused in one line before any training."""
    args: list[str] = []
    specs = plan(compose("ablate", args), args)
    assert seeds_by_cell(specs)[f"{XL}:win64"] == [0, 1, 2] and f"{XL}:nomem" in seeds_by_cell(specs)
    spec = next(s for s in specs if s.cell == f"{XL}:win64")
    assert spec.name == f"{XL}_win64_full_seed0" and spec.mem_len == 0 and spec.window == 64
    assert {"model.mem_len=0", "data.segment_len=64", "data.batch_size=16", "window_cell=true"} <= set(spec.overrides)
    config = compose("train", [*spec.overrides, f"run_dir={tmp_path}"])
    assert config.data.segment_len == 64 and config.data.batch_size * 64 == 32 * 32  # tokens a step: as xl:mem32
    run = Run(tmp_path, OmegaConf.to_container(config, resolve=True))
    assert run.cell == f"{XL}:win64" and run.window == 64
    from posenc_lab.tracking import cell as tracked_cell

    assert tracked_cell(config).window == 64  # wandb names it by the same rule
    bad = ["data.batch_size=31"]
    with pytest.raises(ValueError, match=r"^ablate.same_span: data.batch_size=31 x L=32 tokens a step cannot be cut"):
        plan(compose("ablate", bad), bad)


def test_a_cell_of_any_loss_fraction_can_be_named_in_a_verdict():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(40), 100)
    keys = {
        f"{XL}:mem32:recent0.3": CellName(XL, 32, 0.3),
        f"{XL}:mem32": CellName(XL, 32),
        f"{SINUSOID}:mem32": CellName(SINUSOID, 32),
    }
    means = dict(zip(keys, (0.8, 1.0, 1.0)))
    ev = Evidence({n: m + rng.normal(0, 0.3, (3, len(docs))) for n, m in means.items()}, keys, docs)
    spec = {"id": "v", "claim": "v", "measure": "as_trained", "predict": "<0", "compare": [f"{XL}:mem:recent0.3 - *"]}
    (verdict,), _ = judge({"alpha": 0.05, "verdicts": [spec]}, {"as_trained": ev})
    assert [c.text for c in verdict.comparisons] == [
        f"{XL}:mem32:recent0.3 - {XL}:mem32",
        f"{XL}:mem32:recent0.3 - {SINUSOID}:mem32",
    ]
    assert verdict.status == REPRODUCED


def test_a_cell_of_any_loss_fraction_can_be_named_in_extra_seed_cells():
    args = [
        "experiment=tiny",
        "ablate.half_loss.frac=0.3",
        "ablate.extra_seeds=[1]",
        f"ablate.extra_seed_cells=[{XL}:mem:recent0.3]",
    ]
    specs = plan(compose("ablate", args), args)
    by_cell = seeds_by_cell(specs)
    assert by_cell[f"{XL}:mem16:recent0.3"] == [0, 1] and by_cell[f"{SINUSOID}:mem16:recent0.3"] == [0]
    spec = next(s for s in specs if s.cell == f"{XL}:mem16:recent0.3")
    assert "model.loss_recent_frac=0.3" in spec.overrides and spec.name == f"{XL}_mem16_recent0.3_seed0"
    assert all(s.loss_frac in (1.0, 0.3) for s in specs)
    with pytest.raises(ValueError, match=r"ablate.half_loss.frac must be a number in \(0, 1\)"):
        bad = ["experiment=tiny", "ablate.half_loss.frac=1.5"]
        plan(compose("ablate", bad), bad)


@pytest.mark.parametrize(
    "group, data, mem_len, frac, seed, label",
    [
        (None, "enwik8", 32, 1.0, 0, f"{XL}:mem32, seed 0"),
        ("recall", "recall", 16, 0.5, 3, f"recall/{XL}:mem16:half, seed 3"),
        (None, "enwik8", 0, 0.3, 1, f"{XL}:nomem:recent0.3, seed 1"),
    ],
)
def test_a_planned_run_and_the_run_it_trains_have_one_cell_name(tmp_path, group, data, mem_len, frac, seed, label):
    """The plan (before training) and the analysis (reading the run folder after) name a cell by one rule,
    cellnames.HasCell: a run is found under the cell it was planned for."""
    config = {"posenc": {"name": XL}, "model": {"mem_len": mem_len, "loss_recent_frac": frac}, "data": {"name": data}}
    run = Run(tmp_path, {**config, "seed": seed})
    spec = RunSpec("r", group, XL, mem_len, frac, [], seed)
    assert run.label == spec.label == label and run.cell_name == spec.cell_name and run.cell == spec.cell
    assert isinstance(run, HasCell) and isinstance(spec, HasCell)
    assert Run(tmp_path, config).label == spec.cell  # a run of no known seed: its cell alone


def test_no_module_of_the_analysis_builds_a_cell_name_of_its_own():
    """The twins of analysis/runs.py and posenc_lab/ablate/plan.py are gone: the analysis builds no CellName from
    run settings (it parses names, and takes runs' cells from cellnames.HasCell)."""
    analysis = Path(__file__).resolve().parents[1] / "analysis"
    assert (analysis / "runs.py").is_file()
    builders = sorted(str(p.relative_to(analysis)) for p in analysis.rglob("*.py") if "CellName(" in p.read_text())
    assert builders == []


def test_random_positions_make_their_own_cell(tmp_path):
    """A run trained with +model.random_positions=P is not the same cell as the scheme without: the analysis names
    it <scheme>+rand<P> (as the task grid's plan does), so two such runs of one seed do not collide."""
    from posenc_lab_analysis.runs import Run, cells

    config = {"posenc": {"name": SINUSOID}, "model": {"mem_len": 0}, "data": {"name": "copy"}, "seed": 0}
    plain = Run(tmp_path / "a", config)
    rand = Run(tmp_path / "b", {**config, "model": {"mem_len": 0, "random_positions": 256}})
    assert (plain.cell, rand.cell) == (f"copy/{SINUSOID}:nomem", f"copy/{SINUSOID}+rand256:nomem")
    assert set(cells([plain, rand])) == {plain.cell, rand.cell}


def test_a_hybrid_and_a_dropped_scheme_are_cells_of_their_own():
    """A per-layer hybrid is named by its pattern, DroPE by its step, both before random positions; the plain names
    stay as they were, and the names parse back."""
    irope = {"name": HYBRID, "layers": [ROPE, ROPE, ROPE, NOPE]}
    assert scheme_label(HYBRID, None, irope) == "rope3+nope1"
    assert scheme_label("irope", None, irope) == "rope3+nope1"  # a preset's file name: the node's name wins
    both = {**irope, "windows": {ROPE: 32}, "drop_at_step": 50}
    assert scheme_label(HYBRID, 64, both) == "rope3w32+nope1+drop@50+rand64"
    assert scheme_label(ROPE, None, {"name": ROPE, "drop_at_step": 800}) == "rope+drop@800"
    assert scheme_label(XL, None, {"name": XL, "clamp_len": None}) == XL
    name = str(CellName("rope3+nope1+drop@50", 32))
    assert name == "rope3+nope1+drop@50:mem32" and CellName.parse(name) == CellName("rope3+nope1+drop@50", 32)


def test_a_preset_hybrid_is_planned_and_read_back_under_one_cell(tmp_path):
    """`ablate.schemes=[xl, irope]` plans the hybrid cell by its pattern, in a run folder of that name; the run it
    trains (posenc.name: hybrid, its layers in the config) is read back under the same cell."""
    args = ["experiment=quick", f"ablate.schemes=[{XL},irope]", "ablate.half_loss.schemes=[]"]
    specs = plan(compose("ablate", args), args)
    assert {s.cell for s in specs} == {f"{XL}:mem32", f"{XL}:nomem", "rope3+nope1:mem32", "rope3+nope1:nomem"}
    spec = next(s for s in specs if s.cell == "rope3+nope1:mem32")
    assert spec.name == "rope3+nope1_mem32_full_seed0" and "posenc=irope" in spec.overrides
    config = compose("train", [*spec.overrides, f"run_dir={tmp_path}"])
    run = Run(tmp_path, {**OmegaConf.to_container(config, resolve=True), "seed": 0})
    assert run.scheme == HYBRID and run.label == spec.label == "rope3+nope1:mem32, seed 0"
    dropped = ["experiment=quick", f"ablate.schemes=[{ROPE}]", "+posenc.drop_at_step=100"]
    dropped.append("ablate.half_loss.schemes=[]")
    assert {s.cell for s in plan(compose("ablate", dropped), dropped)} == {"rope+drop@100:mem32", "rope+drop@100:nomem"}


def test_scalable_softmax_a_sink_and_a_gate_are_suffixes_of_the_scheme_part():
    """``model.softmax_scale=ssmax``, ``model.attention_sink`` and ``model.output_gate`` each name their own cell: after
    a hybrid's pattern, in that order, before DroPE and random positions; the plain names stay as they were."""
    irope = {"name": HYBRID, "layers": [ROPE, ROPE, ROPE, NOPE]}
    ssmax, sink, gate = {"softmax_scale": "ssmax"}, {"attention_sink": True}, {"output_gate": True}
    assert scheme_label(SINUSOID, None, None, ssmax) == f"{SINUSOID}+ssmax"
    assert scheme_label(HYBRID, None, irope, ssmax) == "rope3+nope1+ssmax"
    assert scheme_label(ROPE, 64, {"name": ROPE, "drop_at_step": 50}, ssmax) == "rope+ssmax+drop@50+rand64"
    assert scheme_label(ROPE, None, None, {**gate, **sink, **ssmax}) == "rope+ssmax+sink+gate"
    assert scheme_label(ROPE, None, None, {**gate, "attention_sink": False}) == "rope+gate"
    assert scheme_label(SINUSOID, None, None, {"softmax_scale": None, "output_gate": False}) == SINUSOID
    assert CellName.parse("rope3+nope1+ssmax:mem32") == CellName("rope3+nope1+ssmax", 32)
    assert CellName.parse("rope+sink+gate:mem32") == CellName("rope+sink+gate", 32)


def test_a_scheme_and_its_ssmax_entry_are_two_cells_of_one_table(tmp_path):
    """`ablate.schemes=[sinusoid, sinusoid+ssmax, irope+ssmax]`: the entry S+ssmax trains S with
    model.softmax_scale=ssmax into a run folder of its own; the runs read back under the cells they were planned
    for, two cells (not one cell holding seed 0 twice) and two rows of one Table 6."""
    from posenc_lab_analysis.runs import cells
    from posenc_lab_analysis.sections.table6 import rows
    from tests.analysis.sections.test_table6 import UNITS, dump

    args = ["experiment=tiny", f"ablate.schemes=[{SINUSOID},{SINUSOID}+ssmax,irope+ssmax]"]
    args += ["ablate.half_loss.schemes=[]", "ablate.recall.schemes=[]", "ablate.recurrence=[true]"]
    specs = plan(compose("ablate", args), args)
    planned = {s.cell: s for s in specs}
    assert set(planned) == {f"{SINUSOID}:mem16", f"{SINUSOID}+ssmax:mem16", "rope3+nope1+ssmax:mem16"}
    ssmax = planned[f"{SINUSOID}+ssmax:mem16"]
    assert ssmax.name == f"{SINUSOID}+ssmax_mem16_full_seed0" and f"posenc={SINUSOID}" in ssmax.overrides
    assert "model.softmax_scale=ssmax" in ssmax.overrides
    assert "model.softmax_scale=ssmax" not in planned[f"{SINUSOID}:mem16"].overrides
    runs = []
    for spec in specs:
        config = OmegaConf.to_container(compose("train", [*spec.overrides, f"run_dir={tmp_path}"]), resolve=True)
        runs.append(Run(tmp_path / spec.name, {**config, "seed": spec.seed}))
    assert {r.cell: r.label for r in runs} == {c: s.label for c, s in planned.items()}
    grouped = cells(runs)
    assert set(grouped) == set(planned) and all(len(g) == 1 for g in grouped.values())
    rng = np.random.default_rng(0)
    trained = {r.name: dump(rng, m) for r, m in zip(runs, (1.0, 1.2, 1.4))}
    table = rows(grouped, trained, None, UNITS, 1.0, "nats", 0.9).set_index("cell")
    assert table.loc[f"{SINUSOID}+ssmax:mem16", "scheme"] == SINUSOID == table.loc[f"{SINUSOID}:mem16", "scheme"]
    assert len(table) == 3


def test_an_ssmax_override_names_every_cell_and_a_bad_entry_is_one_line():
    """`model.softmax_scale=ssmax` for the whole grid: every planned cell is S+ssmax, as its runs will read back; an
    entry with another suffix is named with the valid forms."""
    args = ["experiment=tiny", f"ablate.schemes=[{XL}]", "model.softmax_scale=ssmax", "ablate.half_loss.schemes=[]"]
    args += ["ablate.recall.schemes=[]"]
    assert {s.cell for s in plan(compose("ablate", args), args)} == {f"{XL}+ssmax:mem16", f"{XL}+ssmax:nomem"}
    bad = ["experiment=tiny", f"ablate.schemes=[{XL}+ssmx]"]
    with pytest.raises(ValueError, match=r"^ablate: ablate.schemes names unknown scheme\(s\) \['xl\+ssmx'\]; valid: .*"
                       r"each alone or with \+ssmax, \+sink, \+gate, \+abacus, \+coupling after it "
                       r"\(model.softmax_scale=ssmax, model.attention_sink=true, model.output_gate=true, "
                       r"model.data_positions=abacus, model.data_positions=coupling\)$"):  # fmt: skip
        plan(compose("ablate", bad), bad)


def test_sink_and_gate_entries_plan_cells_of_their_own_with_their_overrides():
    """`ablate.schemes=[rope, rope+sink, rope+gate, rope+sink+gate]`: four cells, each run with the options its
    marks name and no other; the runs' configs read back under the same cells (wandb's names too)."""
    from posenc_lab.tracking import cell

    args = ["experiment=tiny", f"ablate.schemes=[{ROPE},{ROPE}+sink,{ROPE}+gate,{ROPE}+sink+gate]"]
    args += ["ablate.half_loss.schemes=[]", "ablate.recall.schemes=[]", "ablate.recurrence=[true]"]
    planned = {s.cell: s for s in plan(compose("ablate", args), args)}
    assert set(planned) == {f"{ROPE}{m}:mem16" for m in ("", "+sink", "+gate", "+sink+gate")}
    both = planned[f"{ROPE}+sink+gate:mem16"].overrides
    assert "model.attention_sink=true" in both and "model.output_gate=true" in both
    assert "model.output_gate=true" not in planned[f"{ROPE}+sink:mem16"].overrides
    assert not {"model.attention_sink=true", "model.output_gate=true"} & set(planned[f"{ROPE}:mem16"].overrides)
    for name, spec in planned.items():
        assert str(cell(compose("train", spec.overrides))).endswith(name), name
