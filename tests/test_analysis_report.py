"""The main job end to end: `posenc-lab ablate experiment=tiny` trains the grid, runs every analysis
and writes a report whose tables equal the CSVs beside it and whose figures exist. The `quick`
preset (the one users run first, <= 3 min on 2 cores) is the slow variant of the same test."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

from posenc_lab_analysis import ablate
from posenc_lab_analysis.effective_context import analyze as recl_analyze
from posenc_lab_analysis.runs import RunError, find_runs, load_run

SECTIONS = [
    "Ablation table",
    "Relative effective context length",
    "Extrapolation",
    "Attention spans",
    "Evaluation speed",
    "Recall probe",
]
TABLES = [
    "table_ablation",
    "table_recl",
    "table_extrapolation",
    "table_not_applicable",
    "table_attention",
    "table_eval_speed",
    "table_recall",
]
FIGURES = [
    "effective_context/loss_by_context.png",
    "extrapolation/extrapolation_segment.png",
    "extrapolation/extrapolation_memory.png",
    "extrapolation/extrapolation_horizon.png",
    "attention/attention_heatmap.png",
    "eval_speed/eval_speed.png",
    "recall/recall_accuracy.png",
]


def run_ablate(preset: str, out: Path) -> float:
    start = time.perf_counter()
    assert ablate.main([f"experiment={preset}", f"ablate.out={out}"]) == 0
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate") / "tiny"
    seconds = run_ablate("tiny", out)
    print(f"ablate experiment=tiny: {seconds:.1f} s")
    return out


def md_tables(text: str) -> dict[str, pd.DataFrame]:
    """Tables of the report by the CSV their caption links to, as strings."""
    tables = {}
    for m in re.finditer(r"\(\[(\w+)\.csv\]\(\1\.csv\)\)\n\n((?:\|.*\|\n?)+)", text):
        lines = [ln for ln in m.group(2).strip().split("\n")]
        head = [c.strip() for c in lines[0].strip("|").split(" | ")]
        rows = [[c.strip() for c in re.split(r"(?<!\\)\|", ln.strip()[1:-1])] for ln in lines[2:]]
        tables[m.group(1)] = pd.DataFrame(rows, columns=head)
    return tables


def assert_cell_equals(md: str, csv_value, where: str) -> None:
    if md == "n/a":
        missing = csv_value is None or (isinstance(csv_value, float) and math.isnan(csv_value))
        assert missing or csv_value == "n/a", where
        return
    if re.fullmatch(r"-?\d+\.\d+", md):
        decimals = len(md.split(".")[1])
        assert abs(float(md) - float(csv_value)) <= 0.5 * 10**-decimals + 1e-12, f"{where}: {md} vs {csv_value}"
    elif re.fullmatch(r"-?\d+", md):
        assert float(md) == float(csv_value), f"{where}: {md} vs {csv_value}"
    elif md in ("yes", "no"):
        assert str(csv_value).lower() in (("true", "yes") if md == "yes" else ("false", "no")), where
    else:
        assert md == str(csv_value).replace("|", "\\|"), f"{where}: {md!r} vs {csv_value!r}"


def check_report(out: Path, sections=SECTIONS, tables=TABLES, figures=FIGURES) -> str:
    report = out / "report" / "report.md"
    text = report.read_text()
    for s in sections:
        assert re.search(rf"^## \d+\. {s}", text, re.M), f"section {s!r} missing"
    for f in figures:
        assert f"]({f})" in text and (report.parent / f).stat().st_size > 5000, f"figure {f}"
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (report.parent / link).is_file(), link
    found = md_tables(text)
    for name in tables:
        assert name in found, f"table {name} missing"
        md = found[name]
        csv = pd.read_csv(report.parent / f"{name}.csv", keep_default_na=False, na_values=[""])
        assert list(md.columns) == list(csv.columns), name
        assert len(md) == len(csv), name
        for i in range(len(md)):
            for col in md.columns:
                assert_cell_equals(md.at[i, col], csv.at[i, col], f"{name}[{i}].{col}")
    return text


def test_tiny_ablation_report_has_every_table_and_figure(tiny):
    text = check_report(tiny)
    # the learned table is sized to the training segment: longer segments are n/a, with the reason
    na = pd.read_csv(tiny / "report" / "table_not_applicable.csv")
    assert set(na["scheme"]) == {"learned"} and na["reason"].str.contains("max_positions").all()
    # the text under the tables is computed from them: the best row it names is the table's best
    t6 = pd.read_csv(tiny / "report" / "table_ablation.csv")
    top = t6.loc[t6["init_bpb"].idxmin()]
    assert f"{top['scheme']} (memory {top['recurrence']}, {top['loss']} loss), {top['init_bpb']:.3f}" in text
    # all five mission schemes, with and without memory, plus the preset's half-loss runs
    rows = set(zip(t6["scheme"], t6["recurrence"], t6["loss"]))
    for scheme in ("sinusoid", "learned", "global_sinusoid", "shaw", "xl"):
        assert {(scheme, "on", "full"), (scheme, "off", "full")} <= rows
    assert {("sinusoid", "on", "half"), ("xl", "on", "half")} <= rows


def test_ablate_resumes_finished_runs(tiny, capsys):
    cfg = ablate.compose("ablate", ["experiment=tiny", f"ablate.out={tiny}"])
    specs = ablate.plan(cfg, ["experiment=tiny"])
    spec = specs[0]
    ckpt = tiny / "runs" / spec.name / "checkpoints" / "last.ckpt"
    before = ckpt.stat().st_mtime_ns
    status, _ = ablate.train_one(spec, tiny / "runs" / spec.name, retrain=False, log=print)
    assert status == "reused" and ckpt.stat().st_mtime_ns == before
    # a finished run with other settings is not silently reused
    other = [*spec.overrides, "trainer.max_steps=7"]
    with pytest.raises(ValueError, match="other settings"):
        ablate.train_one(
            ablate.RunSpec(spec.name, spec.group, spec.scheme, spec.mem_len, spec.loss_frac, other),
            tiny / "runs" / spec.name,
            retrain=False,
            log=print,
        )


def test_bad_inputs_are_clear_errors(tiny, tmp_path):
    runs = find_runs([tiny / "runs"])  # a folder of runs, searched recursively like a multirun folder
    assert len(runs) == 14
    with pytest.raises(RunError, match="one corpus only"):
        recl_analyze(runs, tmp_path / "recl")  # pystdlib and recall runs in one RECL group
    broken = tmp_path / "broken"
    shutil.copytree(tiny / "runs" / "xl_mem16_full_seed0", broken, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(RunError, match="no checkpoint"):
        load_run(broken)
    with pytest.raises(RunError, match="not a posenc-lab run directory"):
        load_run(tmp_path)
    with pytest.raises(RunError, match="no checkpoint"):  # found while searching a folder: still an error
        find_runs([tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no posenc-lab runs"):
        find_runs([tmp_path / "empty"])


def test_report_reads_a_multirun_folder(tiny, tmp_path):
    """A Hydra multirun folder: numbered job folders with .hydra/ inside."""
    multi = tmp_path / "multirun" / "2026-01-01" / "00-00-00"
    for i, name in enumerate(["xl_mem16_full_seed0", "xl_mem0_full_seed0"]):
        job = multi / f"{i}_xl_pystdlib"
        shutil.copytree(tiny / "runs" / name, job)
        (job / ".hydra").mkdir()
        (job / ".hydra" / "config.yaml").write_text("not: a run\n")
    from posenc_lab_analysis import report

    assert report.main([str(tmp_path / "multirun"), "--out", str(tmp_path / "rep"), "--no-speed"]) == 0
    t6 = pd.read_csv(tmp_path / "rep" / "table_ablation.csv")
    assert sorted(t6["recurrence"]) == ["off", "on"]


@pytest.mark.slow
def test_quick_preset_report(tmp_path):
    """The `quick` preset as users run it: every table and figure; numbers equal the CSVs."""
    seconds = run_ablate("quick", tmp_path / "quick")
    print(f"ablate experiment=quick: {seconds:.1f} s")
    check_report(tmp_path / "quick", sections=SECTIONS[:-1], tables=TABLES[:-1], figures=FIGURES[:-1])


def test_ablate_is_a_posenc_lab_command(monkeypatch, capsys, tmp_path):
    """pyproject registers `ablate` in the entry-point group that posenc_lab.cli discovers."""
    from importlib.metadata import EntryPoint

    import tomllib

    from posenc_lab import cli

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    value = pyproject["project"]["entry-points"][cli.ENTRY_POINT_GROUP]["ablate"]
    assert value == "posenc_lab_analysis.ablate:main"
    ep = EntryPoint(name="ablate", value=value, group=cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [ep] if group == cli.ENTRY_POINT_GROUP else [])
    assert cli.main(["ablate", "--plan", "experiment=quick", f"ablate.out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "12 runs" in out and "posenc-lab train experiment=quick posenc=xl model.mem_len=0" in out
    assert cli.main(["ablate", "experiment=no_such_preset"]) == 2


def test_report_logs_to_wandb_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from posenc_lab_analysis.report import log_to_wandb

    log_to_wandb(tiny / "report", "posenc-lab-test", [tiny / "runs"], group="tiny")
    runs = list(tmp_path.glob("wandb/offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_each_script_runs_on_its_own(tiny, tmp_path):
    """The plain scripts (python -m posenc_lab_analysis.X) on two runs: each writes its tables and figures."""
    from posenc_lab_analysis import attention_span, effective_context, eval_speed, extrapolation

    runs = [str(tiny / "runs" / "xl_mem16_full_seed0"), str(tiny / "runs" / "learned_mem0_full_seed0")]
    assert (
        extrapolation.main(
            [
                *runs,
                "--out",
                str(tmp_path / "ext"),
                "--n-rows",
                "2",
                "--segment-factors",
                "1,4",
                "--memory-factors",
                "1,2",
                "--horizon-factor",
                "2",
            ]
        )
        == 0
    )
    ext = pd.read_csv(tmp_path / "ext" / "extrapolation.csv")
    assert (ext[ext["status"] != "ok"]["scheme"] == "learned").all() and (ext["status"] != "ok").any()
    assert {"extrapolation_segment.png", "extrapolation_memory.png", "extrapolation_horizon.png"} <= {
        p.name for p in (tmp_path / "ext").iterdir()
    }
    assert (
        effective_context.main(
            [
                *runs,
                "--out",
                str(tmp_path / "recl"),
                "--n-rows",
                "2",
                "--n-score",
                "16",
                "--delta",
                "8",
                "--c-max",
                "32",
            ]
        )
        == 0
    )
    assert (tmp_path / "recl" / "recl.csv").is_file()
    assert len(list((tmp_path / "recl" / "context_losses").glob("*.npz"))) == 2
    assert (
        effective_context.main(
            ["--from-dumps", str(tmp_path / "recl" / "context_losses"), "--out", str(tmp_path / "recl2")]
        )
        == 0
    )
    a = pd.read_csv(tmp_path / "recl" / "recl.csv").sort_values(["cell", "r"])
    b = pd.read_csv(tmp_path / "recl2" / "recl.csv").sort_values(["cell", "r"])
    assert a["recl"].tolist() == b["recl"].tolist() and a["limited"].tolist() == b["limited"].tolist()
    assert attention_span.main([*runs, "--out", str(tmp_path / "att"), "--n-rows", "1", "--n-segments", "1"]) == 0
    assert (tmp_path / "att" / "attention_heatmap.png").is_file()
    assert (
        eval_speed.main(
            ["--out", str(tmp_path / "speed"), "--run", runs[0], "--attn-lens", "16,32", "--segment-len", "16"]
        )
        == 0
    )
    assert len(pd.read_csv(tmp_path / "speed" / "eval_speed.csv")) == 4
    # mixed corpora in one RECL group: a clear error, exit status 2
    assert (
        effective_context.main(
            [runs[0], str(tiny / "runs" / "recall_xl_mem16_full_seed0"), "--out", str(tmp_path / "bad")]
        )
        == 2
    )


def test_truncated_analysis_files_recover_or_name_what_to_delete(tiny, tmp_path, capsys):
    """Fault injection: each kind of file the analysis writes or reads, truncated. A per-token loss
    dump is named and recomputed (the result equals the clean one); CSVs, PNGs and report.md are
    rewritten whole by the next command; a broken results.json of a run is named with what to delete.
    Every file is written atomically: no temporary file is left behind."""
    from posenc_lab_analysis import effective_context, report

    runs = [str(tiny / "runs" / "xl_mem16_full_seed0"), str(tiny / "runs" / "xl_mem0_full_seed0")]
    out = tmp_path / "recl"
    args = [*runs, "--out", str(out), "--n-rows", "2", "--n-score", "16", "--delta", "8", "--c-max", "32"]
    assert effective_context.main(args) == 0
    clean = pd.read_csv(out / "recl.csv")
    dump = out / "context_losses" / "xl_mem16_full_seed0.npz"
    dump.write_bytes(dump.read_bytes()[:200])
    capsys.readouterr()
    assert effective_context.main(["--from-dumps", str(out / "context_losses"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert str(dump) in err and "delete it" in err
    (out / "recl.csv").write_text((out / "recl.csv").read_text()[:50])
    assert effective_context.main(args) == 0
    log = capsys.readouterr().out
    assert f"{dump} cannot be read" in log and "recomputing" in log
    pd.testing.assert_frame_equal(pd.read_csv(out / "recl.csv"), clean)

    rep = tmp_path / "rep"
    assert report.main([*runs, "--out", str(rep), "--no-speed"]) == 0
    text = (rep / "report.md").read_text()
    table = pd.read_csv(rep / "table_ablation.csv")
    for path in (rep / "report.md", rep / "table_ablation.csv", rep / "effective_context" / "loss_by_context.png"):
        path.write_bytes(path.read_bytes()[:40])
    assert report.main([*runs, "--out", str(rep), "--no-speed"]) == 0
    again = (rep / "report.md").read_text()
    assert again.split("\n", 3)[3] == text.split("\n", 3)[3]  # all but the time stamp line
    pd.testing.assert_frame_equal(pd.read_csv(rep / "table_ablation.csv"), table)
    assert (rep / "effective_context" / "loss_by_context.png").stat().st_size > 5000

    broken = tmp_path / "broken"
    shutil.copytree(runs[0], broken)
    (broken / "results.json").write_text('{"val": {"loss": 1.')
    with pytest.raises(RunError, match=re.escape(str(broken / "results.json")) + r" is corrupt.*delete it"):
        load_run(broken)
    capsys.readouterr()
    assert report.main([str(broken), "--out", str(tmp_path / "rep2"), "--no-speed"]) == 2
    err = capsys.readouterr().err
    assert str(broken / "results.json") in err and "delete it" in err
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
