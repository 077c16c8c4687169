"""Upload an analysis report to Weights & Biases: every CSV table as a ``wandb.Table``, every PNG
figure as a ``wandb.Image``, the runs' final figures as one table, and the whole report folder
as an artifact, in one wandb run (job_type ``report``) grouped with the sweep it analyses.

    python -m posenc_lab_analysis.report runs/sweeps/SWEEP_ID --out reports/SWEEP_ID
    python -m posenc_lab_analysis.wandb_upload reports/SWEEP_ID --runs runs/sweeps/SWEEP_ID --project posenc-lab

Grouping. The training runs of a sweep log to wandb themselves (``logger=wandb``: resolved config,
metrics; named and grouped by ``posenc_lab.tracking``: group ``sweep-SWEEP_ID/<cell>``, job_type = the sweep's
name, tags). This run goes in ``--group`` (default: ``sweep-SWEEP_ID`` when the runs live in
``runs/sweeps/SWEEP_ID/``, else the runs folder's name) and tags every scheme it covers; the tables keep their
``scheme`` column so that the wandb UI can group their rows by scheme, and the run summary holds every run's
final figures under ``runs/<cell>/seed<S>/`` (``tracking.summary_key``, the cell as the report names it: the
seeds of a cell and its full- and recent-loss runs each keep their own). Works offline: ``WANDB_MODE=offline``
(sync later with ``wandb sync``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posenc_lab.io import CorruptFileError
from posenc_lab.metrics import FIGURES
from posenc_lab.rundir import RunDir, RunDirError
from posenc_lab.tracking import summary_key

from .runs import Run, RunError, cells

# Final figures of a run's results.json that go into the runs table.
_RESULT_KEYS = ("loss", *FIGURES.values(), "acc")


def run_rows(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per finished run (``RunDir.finished``) under ``run_dirs``, with its cell as the report names it
    (``runs.cells``); a damaged file, or two runs of one cell with one seed, is named (RunError)."""
    found: list[tuple[Run, dict[str, Any]]] = []
    for root in map(Path, run_dirs):
        dirs = [root] if RunDir(root).config_file.is_file() else [p.parent for p in sorted(root.rglob(RunDir.CONFIG))]
        for d in dirs:
            run = RunDir(d)
            if any(part.startswith(".") for part in d.relative_to(root).parts) or not run.finished:
                continue
            try:
                cfg, res = run.config(), run.results()
            except (CorruptFileError, RunDirError) as e:
                raise RunError(str(e)) from e
            found.append((Run(d, cfg, res), {"run": str(d.relative_to(root)) if d != root else d.name}))
    cell_of = {id(r): name for name, group in cells([r for r, _ in found]).items() for r in group}
    rows = []
    for r, row in found:
        cfg, res = r.config, r.results or {}
        row.update(
            cell=cell_of[id(r)],
            scheme=cfg["posenc"].get("name", res.get("scheme")),
            data=cfg["data"].get("name", res.get("data")),
            mem_len=cfg["model"].get("mem_len", res.get("mem_len")),
            segment_len=cfg["data"].get("segment_len"),
            loss_recent_frac=cfg["model"].get("loss_recent_frac", 1.0),
            steps=res.get("steps"),
            seed=r.seed if r.seed is not None else res.get("seed"),
            params=res.get("params"),
        )
        for split in ("val", "test"):
            for k in _RESULT_KEYS:
                v = (res.get(split) or {}).get(k)
                if v is not None:
                    row[f"{split}_{k}"] = v
        rows.append(row)
    return rows


def default_group(report_dir: Path, run_dirs: Sequence[Path]) -> str:
    """The sweep id for runs in runs/sweeps/SWEEP_ID/..., else the (first) runs folder's name."""
    for d in run_dirs:
        parts = Path(d).resolve().parts
        if "sweeps" in parts[:-1]:
            i = len(parts) - 1 - parts[::-1].index("sweeps")
            if i + 1 < len(parts):
                return f"sweep-{parts[i + 1]}"
    return Path(run_dirs[0]).resolve().name if run_dirs else Path(report_dir).resolve().name


def upload(
    report_dir: str | os.PathLike,
    runs: Sequence[str | os.PathLike] = (),
    project: str = "posenc-lab",
    entity: str | None = None,
    group: str | None = None,
    name: str | None = None,
    job_type: str = "report",
    tags: Sequence[str] = (),
    wandb_dir: str | None = None,
) -> str:
    """Log the report in ``report_dir`` (and the runs' results) to one wandb run; return its id."""
    import wandb

    report_dir = Path(report_dir)
    if not report_dir.is_dir():
        raise FileNotFoundError(
            f"{report_dir}: no such report folder (write one with python -m posenc_lab_analysis.report)"
        )
    run_dirs = [Path(r) for r in runs]
    csvs = sorted(p for p in report_dir.rglob("*.csv") if p.is_file())
    pngs = sorted(p for p in report_dir.rglob("*.png") if p.is_file())
    if not csvs and not pngs:
        raise FileNotFoundError(f"{report_dir}: no CSV tables or PNG figures to upload")
    rows = run_rows(run_dirs)
    schemes = sorted({str(r["scheme"]) for r in rows if r.get("scheme")})
    for csv in csvs:  # schemes named in the tables too
        try:
            col = pd.read_csv(csv, usecols=["scheme"])["scheme"]
            schemes = sorted(set(schemes) | {str(s) for s in col.dropna().unique()})
        except (ValueError, KeyError):
            pass
    group = group or default_group(report_dir, run_dirs)
    run = wandb.init(
        project=project,
        entity=entity,
        group=group,
        job_type=job_type,
        name=name or f"report-{group}",
        tags=sorted(set(tags) | set(schemes)),
        dir=wandb_dir,
        reinit="finish_previous",
        config={
            "report_dir": str(report_dir.resolve()),
            "runs": [str(d.resolve()) for d in run_dirs],
            "schemes": schemes,
            "n_runs": len(rows),
        },
    )
    try:
        logged: dict[str, Any] = {}
        for csv in csvs:
            key = "tables/" + csv.relative_to(report_dir).with_suffix("").as_posix()
            logged[key] = wandb.Table(dataframe=pd.read_csv(csv))
        for png in pngs:
            rel = png.relative_to(report_dir).with_suffix("")
            logged["figures/" + rel.as_posix()] = wandb.Image(str(png), caption=rel.as_posix())
        if rows:
            logged["tables/runs"] = wandb.Table(dataframe=pd.DataFrame(rows))
        run.log(logged)
        for row in rows:  # also as summary numbers, one set per run (its cell and seed), for wandb's charts
            for k, v in row.items():
                if k.startswith(("val_", "test_")) and isinstance(v, (int, float)):
                    run.summary[summary_key(row["cell"], row["seed"], k)] = v
        artifact = wandb.Artifact(
            f"report-{_safe(group)}",
            type="report",
            description=f"analysis report of {', '.join(map(str, run_dirs)) or report_dir}",
        )
        artifact.add_dir(str(report_dir))
        run.log_artifact(artifact)
        return run.id
    finally:
        run.finish()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.wandb_upload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", type=Path, help="a report folder written by analysis/report.py (report.md, CSVs, PNGs)")
    p.add_argument(
        "--runs",
        nargs="*",
        default=[],
        type=Path,
        help="the run folders the report analysed (runs/sweeps/ID, a Hydra multirun dir)",
    )
    p.add_argument("--project", default="posenc-lab")
    p.add_argument("--entity", default=None)
    p.add_argument(
        "--group", default=None, help="wandb group (default: sweep-ID for runs/sweeps/ID, else the runs folder)"
    )
    p.add_argument("--name", default=None)
    p.add_argument("--job-type", default="report")
    p.add_argument("--tags", nargs="*", default=[])
    a = p.parse_args(argv)
    try:
        run_id = upload(
            a.report,
            a.runs,
            project=a.project,
            entity=a.entity,
            group=a.group,
            name=a.name,
            job_type=a.job_type,
            tags=a.tags,
        )
    except (FileNotFoundError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"uploaded {a.report} as wandb run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
