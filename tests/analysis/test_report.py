"""The main job end to end: `posenc-lab ablate experiment=tiny` trains the grid, runs every analysis and writes
a report whose tables equal the CSVs beside it and whose figures exist; every analysis file recovers from
damage or names what to delete. The `quick` preset (the one users run first) is the slow variant."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posenc_lab import ablate
from posenc_lab.tracking import summary_key
from posenc_lab_analysis import report
from posenc_lab_analysis.dumps import read_dump
from posenc_lab_analysis.report import ReportSettings
from posenc_lab_analysis.runs import RunError, cells, find_runs, load_run
from posenc_lab_analysis.sections import SECTIONS
from tests.schemes import XL
from tests.test_tracking import offline_runs

# What each section of the default report shows, by its registry name (analysis/sections/): its tables and figures.
SHOWN = {
    "verdicts": ([], []),
    "table6": (["table_ablation"], []),
    "position": (["table_position_summary"], ["position/loss_by_position.png"]),
    "context_use": (["table_context_use"], ["context_use.png"]),
    "effective_context": (
        ["table_effective_context", "table_training_distances"],
        ["context_curves.png", "training_distances.png"],
    ),
    "recl": (["table_recl"], ["recl_gain_curves.png"]),
    "extrapolation": (
        ["table_extrapolation", "table_not_applicable"],
        [f"extrapolation/extrapolation_{axis}.png" for axis in ("segment", "memory", "horizon")],
    ),
    "attention": (["table_attention"], ["attention/attention_heatmap.png"]),
    "recall": (["table_recall"], ["recall/recall_accuracy.png"]),
    "reach": (["table_reach"], ["recall/reach_heatmap.png"]),
    "speed": (["table_eval_speed"], ["eval_speed/eval_speed.png"]),
}


def run_ablate(preset: str, out: Path, *extra: str) -> float:
    start = time.perf_counter()
    assert ablate.main([f"experiment={preset}", f"ablate.out={out}", *extra]) == 0
    return time.perf_counter() - start


@pytest.fixture
def tiny(tiny_ablation):
    return tiny_ablation


def md_tables(text: str) -> dict[str, pd.DataFrame]:
    """Tables of the report by the CSV their caption links to, as strings."""
    tables = {}
    for m in re.finditer(r"\(\[(\w+)\.csv\]\(\1\.csv\)\)\n\n((?:\|.*\|\n?)+)", text):
        lines = m.group(2).strip().split("\n")
        head = [c.strip() for c in lines[0].strip("|").split(" | ")]
        rows = [[c.strip() for c in re.split(r"(?<!\\)\|", ln.strip()[1:-1])] for ln in lines[2:]]
        tables[m.group(1)] = pd.DataFrame(rows, columns=head)
    return tables


def assert_cell_equals(md: str, csv_value, where: str) -> None:
    if md == "n/a":
        missing = csv_value is None or (isinstance(csv_value, float) and math.isnan(csv_value))
        assert missing or csv_value == "n/a", where
    elif re.fullmatch(r"-?\d+\.\d+", md):
        assert abs(float(md) - float(csv_value)) <= 0.5 * 10 ** -len(md.split(".")[1]) + 1e-12, (
            f"{where}: {md} vs {csv_value}"
        )
    elif re.fullmatch(r"-?\d+", md):
        assert float(md) == float(csv_value), f"{where}: {md} vs {csv_value}"
    elif md in ("yes", "no"):
        assert str(csv_value).lower() in (("true", "yes") if md == "yes" else ("false", "no")), where
    else:
        assert md == str(csv_value).replace("|", "\\|"), f"{where}: {md!r} vs {csv_value!r}"


def check_report(out: Path, without: tuple[str, ...] = ()) -> str:
    """Every section of SHOWN but ``without``, numbered in the order conf/ablate.yaml states, with its tables equal
    to their CSVs and its figures linked."""
    rep = out / "report" / "report.md"
    text = rep.read_text()
    names = [n for n in SHOWN if n not in without]
    tables = [t for n in names for t in SHOWN[n][0]]
    figures = [f for n in names for f in SHOWN[n][1]]
    titles = [m.group(1) for m in re.finditer(r"^## \d+\. (.+)$", text, re.M)]
    order = [n for n in ReportSettings.defaults().shared.sections if n in names]
    assert titles == [SECTIONS[n].title for n in order], titles
    for f in figures:
        assert f"]({f})" in text and (rep.parent / f).stat().st_size > 5000, f"figure {f}"
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (rep.parent / link).is_file(), link
    found = md_tables(text)
    for name in tables:
        assert name in found, f"table {name} missing"
        md, csv = found[name], pd.read_csv(rep.parent / f"{name}.csv", keep_default_na=False, na_values=[""])
        assert list(md.columns) == list(csv.columns) and len(md) == len(csv), name
        for i in range(len(md)):
            for col in md.columns:
                assert_cell_equals(md.at[i, col], csv.at[i, col], f"{name}[{i}].{col}")
    return text


def test_tiny_ablation_report_has_every_section_table_and_figure(tiny):
    text = check_report(tiny)
    assert "This is a smoke run" in text and text.count("not judged (smoke run)") >= 8
    assert "## Held-out text" in text and "test split" in text
    verdicts = pd.read_csv(tiny / "report" / "table_verdicts.csv")
    assert len(verdicts) == 9 and "memory_narrows_fragmentation" not in set(verdicts["verdict"])
    controls = pd.read_csv(tiny / "report" / "table_controls.csv")  # shown apart, in their own table
    assert set(controls["verdict"]) == {
        "memory_narrows_fragmentation",
        "recall_needs_memory",
        "global_sinusoid_past_episodes",
    }
    assert "controls: expected to hold; a failure is a defect of the run" in text
    positions = pd.read_csv(tiny / "report" / "table_position.csv")  # every cell at every position of L = 16
    assert positions.groupby("cell")["position"].apply(list).map(lambda p: p == list(range(16))).all()
    na = pd.read_csv(tiny / "report" / "table_not_applicable.csv")
    assert set(na["cell"]) == {"learned:mem16", "learned:nomem"} and na["reason"].str.contains("max_positions").all()
    t6 = pd.read_csv(tiny / "report" / "table_ablation.csv")
    assert set(positions["cell"]) == set(t6["cell"])
    for scheme in ("sinusoid", "learned", "global_sinusoid", "shaw", "xl"):
        assert {f"{scheme}:mem16", f"{scheme}:nomem"} <= set(t6["cell"])
    assert {"sinusoid:mem16:half", "xl:mem16:half"} <= set(t6["cell"])
    assert (t6["vs_lowest"] == "0 (the lowest)").sum() == 1


def test_every_run_is_scored_on_the_same_test_tokens_with_their_documents(tiny):
    dumps = [read_dump(p) for p in sorted((tiny / "report" / "dumps" / "as_trained").glob("*.npz"))]
    assert len(dumps) == 12 and all(d.meta["split"] == "test" for d in dumps)
    assert all(np.array_equal(d.documents, dumps[0].documents) for d in dumps)
    assert len(np.unique(dumps[0].documents)) >= 4  # 8 streams spread over the split


def test_ablate_reuses_finished_runs_and_refuses_other_settings(tiny, capsys):
    ckpt = tiny / "runs" / "xl_mem16_full_seed0" / "checkpoints" / "last.ckpt"
    before = ckpt.stat().st_mtime_ns
    assert ablate.main(["experiment=tiny", f"ablate.out={tiny}", "--train-only"]) == 0
    assert "14 finished runs reused" in capsys.readouterr().out and ckpt.stat().st_mtime_ns == before
    assert ablate.main(["experiment=tiny", f"ablate.out={tiny}", "optim.lr=0.5", "--train-only"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run with other settings" in err and "optim.lr: run" in err


def test_bad_inputs_are_clear_errors(tiny, tmp_path):
    runs = find_runs([tiny / "runs"])
    assert len(runs) == 14
    broken = tmp_path / "broken"
    shutil.copytree(tiny / "runs" / "xl_mem16_full_seed0", broken, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(RunError, match="no checkpoint"):
        load_run(broken)
    with pytest.raises(RunError, match="not a posenc-lab run directory"):
        load_run(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no posenc-lab runs"):
        find_runs([tmp_path / "empty"])
    config = tmp_path / "config_broken"
    shutil.copytree(tiny / "runs" / "xl_mem16_full_seed0", config)
    (config / "config.yaml").write_text("posenc: [unclosed\n")
    with pytest.raises(RunError, match=re.escape(str(config / "config.yaml")) + " is corrupt"):
        load_run(config)


def test_report_reads_a_multirun_folder(tiny, tmp_path):
    """A Hydra multirun folder: numbered job folders with .hydra/ inside."""
    multi = tmp_path / "multirun" / "2026-01-01" / "00-00-00"
    for i, name in enumerate(["xl_mem16_full_seed0", "xl_mem0_full_seed0"]):
        job = multi / f"{i}_xl_pystdlib"
        shutil.copytree(tiny / "runs" / name, job, ignore=shutil.ignore_patterns("dumps"))
        (job / ".hydra").mkdir(exist_ok=True)
        (job / ".hydra" / "config.yaml").write_text("not: a run\n")
    assert (
        report.main([str(tmp_path / "multirun"), "--out", str(tmp_path / "rep"), "--no-speed", "--experiment", "tiny"])
        == 0
    )
    t6 = pd.read_csv(tmp_path / "rep" / "table_ablation.csv")
    assert sorted(t6["cell"]) == ["xl:mem16", "xl:nomem"]


@pytest.mark.slow  # the tiny grid's dumps twice more (one process, two workers): about 50 s on 2 CPU cores
def test_dumps_computed_in_worker_processes_equal_those_of_one_process(tiny, tmp_path, capsys):
    """`--jobs 2` computes the runs' per-token dumps in two worker processes (one torch thread each): the same
    losses and settings, to the bit, as one process computing them all; the log says the workers did it."""
    names = ["xl_mem16_full_seed0", "xl_mem0_full_seed0", "shaw_mem16_full_seed0"]
    runs = [str(tiny / "runs" / n) for n in names]
    for jobs in (1, 2):
        args = [*runs, "--out", str(tmp_path / f"jobs{jobs}"), "--no-speed", "--experiment", "tiny"]
        assert report.main([*args, "--jobs", str(jobs)]) == 0
        log = capsys.readouterr().out
        assert ("2 at a time" in log) == (jobs == 2), log
    for folder in ("as_trained", "contexts"):
        for name in names:
            one, two = (read_dump(tmp_path / f"jobs{j}" / "dumps" / folder / f"{name}.npz") for j in (1, 2))
            assert one.meta == two.meta and one.contexts == two.contexts
            assert np.array_equal(one.loss, two.loss, equal_nan=True) and np.array_equal(one.units, two.units)
    with pytest.raises(SystemExit) as stop:  # argparse's error, before any compute
        report.main([*runs, "--out", str(tmp_path / "bad"), "--jobs", "0"])
    assert stop.value.code == 2 and "--jobs must be >= 1 (worker processes), got 0" in capsys.readouterr().err


@pytest.mark.slow  # the tiny grid's whole report again at another level: about 40 s on 2 CPU cores
def test_the_report_states_one_confidence_level_the_one_conf_gives(tiny, tmp_path):
    """`ablate.analysis.level=0.9`: every descriptive interval of the report is at 90% and says so; "95%" appears
    nowhere (report.md, the CSVs), and Table 6's intervals narrow from the default 95% by the t quantiles' ratio."""
    out = tmp_path / "tiny"
    shutil.copytree(tiny, out)  # the finished runs and their dumps: only the report is computed again
    assert ablate.main(["experiment=tiny", f"ablate.out={out}", "ablate.analysis.level=0.9"]) == 0
    text = (out / "report" / "report.md").read_text()
    written = [text] + [p.read_text() for p in (out / "report").rglob("*.csv")]
    assert not [w for w in written if "95%" in w]
    assert "90% interval" in text and "90% intervals" in text and "90% percentile" in text
    width = {}
    for name, folder in (("95", tiny), ("90", out)):
        t6 = pd.read_csv(folder / "report" / "table_ablation.csv").set_index("cell")
        bounds = t6["interval"].str.extract(r"\[([\d.]+), ([\d.]+)\]").astype(float)
        width[name] = bounds[1] - bounds[0]
    assert (width["90"] < width["95"]).all() and (width["90"] > 0.5 * width["95"]).all()


@pytest.mark.slow
def test_quick_preset_report(tmp_path):
    """The `quick` preset as users run it: every table and figure; numbers equal the CSVs."""
    print(f"ablate experiment=quick: {run_ablate('quick', tmp_path / 'quick'):.1f} s")
    check_report(tmp_path / "quick", without=("recall",))


def test_ablate_is_a_posenc_lab_command(capsys, tmp_path):
    """posenc_lab.cli runs `ablate` itself (posenc_lab.ablate.main), with no entry point between them."""
    from posenc_lab import cli

    assert cli.COMMANDS["ablate"][0]() is ablate.main
    assert cli.main(["ablate", "--plan", "experiment=quick", f"ablate.out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "12 runs" in out and "posenc-lab train experiment=quick posenc=xl model.mem_len=0" in out
    assert cli.main(["ablate", "experiment=no_such_preset"]) == 2


def test_the_plan_states_power_on_the_families_the_report_scores(tiny, capsys):
    """`ablate --plan`'s power line names the families of the very tokens the report's as-trained evaluation
    scores: their number and the largest one's share are those of the report's held-out-text section."""
    from posenc_lab import ablate

    assert ablate.main(["experiment=tiny", f"ablate.out={tiny}", "--plan"]) == 0
    planned = re.search(
        r"# power: (\d+) families in the scored tokens \(the largest (\d+\.\d)%\)", capsys.readouterr().out
    )
    report = (tiny / "report" / "report.md").read_text()
    scored = re.search(r"They fall in (\d+) (?:families|documents), .*?the largest holding (\d+\.\d)% of them", report)
    assert planned and scored and planned.groups() == scored.groups(), (planned, scored)


def test_report_logs_to_wandb_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from posenc_lab_analysis.wandb_upload import upload

    report_dir = tiny / "report"
    upload(report_dir, [tiny / "runs"], project="posenc-lab-test", group="tiny")
    (run,) = tmp_path.glob("wandb/offline-run-*")
    media = run / "files" / "media"  # what wandb wrote of each logged table and image (wandb sync uploads these)

    def logged(kind: str, key: str, suffix: str) -> Path:
        found = [
            p
            for p in media.glob(f"{kind}/**/*{suffix}")
            if re.fullmatch(rf"{re.escape(key)}_\d+_[0-9a-f]+", str(p.relative_to(media / kind))[: -len(suffix)])
        ]
        assert len(found) == 1, (key, sorted(media.rglob("*")))
        return found[0]

    csvs, pngs = sorted(report_dir.rglob("*.csv")), sorted(report_dir.rglob("*.png"))
    assert len(csvs) >= 7 and len(pngs) >= 7
    for csv in csvs:  # every table, its columns and values
        key = "tables/" + csv.relative_to(report_dir).with_suffix("").as_posix()
        table = json.loads(logged("table", key, ".table.json").read_text())
        pd.testing.assert_frame_equal(
            pd.DataFrame(table["data"], columns=table["columns"]).astype(object).where(lambda d: d.notna(), None),
            pd.read_csv(csv).astype(object).where(lambda d: d.notna(), None),
            check_dtype=False,
        )
    for png in pngs:  # every figure, as drawn
        key = "figures/" + png.relative_to(report_dir).with_suffix("").as_posix()
        assert logged("images", key, ".png").read_bytes() == png.read_bytes(), key
    runs = json.loads(logged("table", "tables/runs", ".table.json").read_text())
    assert len(runs["data"]) == 14 and {"scheme", "mem_len", "val_loss"} <= set(runs["columns"])
    # the summary keeps every run's own figures (its cell, as the report names it, and seed): xl:mem16 and
    # xl:mem16:half, trained with the full and the recent-half loss, each keep theirs (tracking.summary_key)
    summary = offline_runs(tmp_path)[0]["summary"]
    by_cell = cells(find_runs([tiny / "runs"], need_checkpoint=False))
    assert {f"{XL}:mem16", f"{XL}:mem16:half"} <= set(by_cell) and sum(map(len, by_cell.values())) == 14
    for cell, cell_runs in by_cell.items():
        for r in cell_runs:
            assert summary[summary_key(cell, r.seed, "test_loss")] == r.results["test"]["loss"], (cell, r.seed)


def test_each_script_runs_on_its_own(tiny, tmp_path):
    """The plain scripts (python -m posenc_lab_analysis.X) on two runs, and RECL from dumps alone."""
    from posenc_lab_analysis import attention_span, eval_speed, extrapolation, recl

    runs = [str(tiny / "runs" / "xl_mem16_full_seed0"), str(tiny / "runs" / "learned_mem0_full_seed0")]
    args = ["--out", str(tmp_path / "ext"), "--n-rows", "2", "--segment-factors", "1,4", "--memory-factors", "1,2"]
    assert extrapolation.main([*runs, *args, "--horizon-factor", "2"]) == 0
    ext = pd.read_csv(tmp_path / "ext" / "extrapolation.csv")
    assert (ext[ext["status"] != "ok"]["scheme"] == "learned").all() and (ext["status"] != "ok").any()
    assert attention_span.main([*runs, "--out", str(tmp_path / "att"), "--n-rows", "1", "--n-segments", "1"]) == 0
    assert (tmp_path / "att" / "attention_heatmap.png").is_file()
    speed = ["--out", str(tmp_path / "speed"), "--run", runs[0], "--attn-lens", "16,32", "--segment-len", "16"]
    assert eval_speed.main(speed) == 0
    assert len(pd.read_csv(tmp_path / "speed" / "eval_speed.csv")) == 4
    dumps = tiny / "report" / "dumps" / "contexts"
    assert recl.main([str(dumps), "--out", str(tmp_path / "recl"), "--n-boot", "0"]) == 0
    again = pd.read_csv(tmp_path / "recl" / "recl.csv")
    shown = pd.read_csv(tiny / "report" / "table_recl.csv")
    assert set(again["model"]) == set(shown["cell"])


def test_damaged_analysis_files_recover_or_name_what_to_delete(tiny, tmp_path, capsys):
    """Each kind of file the analysis writes or reads, damaged: a per-token dump is named and recomputed (the
    same result), CSVs, PNGs and report.md are rewritten whole, a broken results.json is named with what to
    delete; temporary files a killed report left are removed."""
    runs = [str(tiny / "runs" / "xl_mem16_full_seed0"), str(tiny / "runs" / "xl_mem0_full_seed0")]
    rep = tmp_path / "rep"
    args = [*runs, "--out", str(rep), "--no-speed", "--experiment", "tiny"]
    assert report.main(args) == 0
    text, table = (rep / "report.md").read_text(), pd.read_csv(rep / "table_ablation.csv")
    dump = rep / "dumps" / "as_trained" / "xl_mem16_full_seed0.npz"
    dump.write_bytes(dump.read_bytes()[:200])
    for path in (rep / "report.md", rep / "table_ablation.csv", rep / "recl_gain_curves.png"):
        path.write_bytes(path.read_bytes()[:40])
    (rep / ".report.md.abc123.tmp.md").write_text("left by a kill")
    capsys.readouterr()
    assert report.main(args) == 0
    assert f"{dump} cannot be read" in capsys.readouterr().out
    assert (rep / "report.md").read_text().split("\n", 3)[3] == text.split("\n", 3)[3]  # all but the time stamp
    pd.testing.assert_frame_equal(pd.read_csv(rep / "table_ablation.csv"), table)
    assert (rep / "recl_gain_curves.png").stat().st_size > 5000
    assert not [p for p in rep.rglob("*") if ".tmp" in p.name]
    broken = tmp_path / "broken"
    shutil.copytree(runs[0], broken)
    (broken / "results.json").write_text('{"val": {"loss": 1.')
    with pytest.raises(RunError, match=re.escape(str(broken / "results.json")) + r" is corrupt.*delete it"):
        load_run(broken)
    assert report.main([str(broken), "--out", str(tmp_path / "rep2"), "--no-speed"]) == 2
    assert str(broken / "results.json") in capsys.readouterr().err


def test_compare_two_runs_and_refuse_what_cannot_be_compared(tiny, tmp_path, capsys):
    """`posenc-lab compare A B`: the difference with its interval beside each side's figure; a side of another
    corpus, and a folder of runs that differ by more than their seed, are refused before any evaluation."""
    from posenc_lab_analysis import compare

    runs = tiny / "runs"
    assert (
        compare.main(
            [
                str(runs / "xl_mem16_full_seed0"),
                str(runs / "xl_mem0_full_seed0"),
                "--n-streams",
                "8",
                "--n-tokens",
                "256",
                "--out",
                str(tmp_path / "dumps"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    a = float(re.search(r"A: .* val bpb (\d+\.\d+)", out).group(1))
    b = float(re.search(r"B: .* val bpb (\d+\.\d+)", out).group(1))
    diff = float(re.search(r"A - B: ([-+]\d+\.\d+) \[", out).group(1))
    assert diff == pytest.approx(a - b, abs=2e-4) and "one seed" in out
    assert len(list((tmp_path / "dumps").glob("*.npz"))) == 2
    assert compare.main([str(runs / "xl_mem16_full_seed0"), str(runs / "recall_xl_mem16_full_seed0")]) == 2
    assert "other corpora or tokenizers" in capsys.readouterr().err
    assert compare.main([str(runs), str(runs / "xl_mem0_full_seed0")]) == 2
    assert "differ by more than their seed" in capsys.readouterr().err


@pytest.mark.slow  # two plans of the default grid, power simulated: about 15 s
def test_the_plan_counts_only_the_verdicts_the_preset_judges(tmp_path, capsys):
    """With `ablate.analysis.verdicts.only` the report puts only those verdicts in Holm's family, and the plan's
    power line counts (and sets Holm's first step by) those alone, not every verdict of conf/paper.yaml."""
    from posenc_lab import ablate

    def counted(*overrides: str) -> int:
        assert ablate.main(["experiment=ablation", f"ablate.out={tmp_path}", *overrides, "--plan"]) == 0
        return int(re.search(r"(\d+) verdicts the report will judge", capsys.readouterr().out).group(1))

    assert counted() > 1
    assert counted("ablate.analysis.verdicts.only=[memory_helps_xl]") == 1


@pytest.mark.slow  # the tiny grid (session fixture), 2 more runs and every analysis again: 1-2 min on 2 CPU cores
def test_a_hybrid_enters_the_report_as_a_cell(tiny, tmp_path):
    """The tiny ablation with a per-layer hybrid added to its schemes (two layers: rope then nope, so the pattern
    fits the model): the finished runs are reused, the hybrid's two are trained, and its cell is a row of the
    report's tables beside the others, with and without memory."""
    out = tmp_path / "tiny"
    shutil.copytree(tiny, out)
    hybrid = [
        "ablate.schemes=[sinusoid,learned,global_sinusoid,shaw,xl,hybrid]",
        "+ablate.scheme_overrides.hybrid=['posenc.layers=[rope,nope]']",
    ]
    assert ablate.main(["experiment=tiny", f"ablate.out={out}", *hybrid]) == 0
    text = check_report(out)
    table6 = pd.read_csv(out / "report" / "table_ablation.csv")
    assert {"rope1+nope1:mem16", "rope1+nope1:nomem", f"{XL}:mem16"} <= set(table6["cell"])
    assert "| rope1+nope1:mem16 |" in text
