"""The ablation report: one Markdown file with its figures and every table's CSV beside it.

The order of work: per-token losses of every run on the test split (``dumps``: as trained, and at controlled
attention lengths), then the verdicts of ``conf/paper.yaml`` (``verdicts``, ``stats``), Table 6, RECL
(``recl``), extrapolation, attention spans, evaluation speed and the recall probe, each turned into a
section (``sections/``) and rendered.

    python -m posenc_lab_analysis.report RUNS_DIR [RUNS_DIR...] --out DIR [--experiment NAME]
RUNS_DIR: run directories or folders holding runs (a Hydra multirun folder, an ablation's runs/ folder).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from posenc_lab.compose import compose
from posenc_lab.data.overlap import WINDOW
from posenc_lab.metrics import figure_name, figure_scale
from posenc_lab.tables import write_csv

from . import attention_span, dumps, eval_speed, evidence, extrapolation, plots, recall, verdicts
from .recl import recl
from .runs import Run, RunError, add_threads_argument, apply_threads, cells, find_runs, set_device
from .sections import Section, render
from .sections import attention as attention_section
from .sections import data as data_section
from .sections import extrapolation as extrapolation_section
from .sections import recall as recall_section
from .sections import recl as recl_section
from .sections import speed as speed_section
from .sections import table6 as table6_section
from .sections import verdicts as verdicts_section


@dataclass
class ContextSettings:
    """The controlled-context evaluation behind Table 6's attention lengths and RECL: c = c_min, c_min + delta,
    ..., c_max (None: delta = L / 4, c_min = delta, c_max = 4 L), plus every run's training attention length."""

    n_rows: int = 64
    n_score: int = 256
    delta: int | None = None
    c_min: int | None = None
    c_max: int | None = None
    window_max: int | None = None  # runs without memory: no window longer than this (None: 2 L)
    n_boot: int = 200

    def grid(self, runs: list[Run]) -> list[int]:
        L = max(r.segment_len for r in runs)
        delta = self.delta or max(1, L // 4)
        c_min, c_max = self.c_min or delta, self.c_max or 4 * L
        if c_max < c_min + delta:
            raise ValueError(f"the context grid needs c_max >= c_min + delta, got {c_min}, {delta}, {c_max}")
        return list(range(c_min, c_max + 1, delta))


@dataclass
class ReportSettings:
    split: str = "test"
    trained: dumps.AsTrained = field(default_factory=dumps.AsTrained)
    context: ContextSettings = field(default_factory=ContextSettings)
    extrapolation: extrapolation.ExtrapolationSettings = field(default_factory=extrapolation.ExtrapolationSettings)
    attention: attention_span.AttentionSettings = field(default_factory=attention_span.AttentionSettings)
    speed_attn_lens: tuple[int, ...] = (64, 128, 256, 512)
    speed_batch: int = 4
    speed_reps: int = 3
    recall: dumps.AsTrained = field(default_factory=lambda: dumps.AsTrained(n_streams=16, n_tokens=4096))
    descriptive_seeds: int | None = 1  # extrapolation and attention spans: the first seeds of each cell (None: all)
    device: str = "cpu"  # where the analyses run the models: cpu, cuda, auto
    level: float = 0.95  # of every descriptive interval
    smoke: bool = False  # a smoke run (ablate.smoke): the report judges nothing

    def __post_init__(self):
        if self.split not in ("val", "test"):
            raise ValueError(f"ablate.analysis.split must be val or test, got {self.split!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"ablate.analysis.level must be in (0, 1), e.g. 0.95, got {self.level!r}")
        if self.context.n_boot < 50:
            raise ValueError(f"ablate.analysis.context.n_boot must be >= 50 replicates, got {self.context.n_boot!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReportSettings:
        """From the ``ablate.analysis`` block of conf/ablate.yaml (unknown keys are named)."""
        d = dict(d)
        split = d.pop("split", "test")

        def make(kind, values, **extra):
            values = dict(values or {})
            names = {f.name for f in fields(kind)}
            unknown = sorted(set(values) - names)
            if unknown:
                raise ValueError(
                    f"ablate.analysis: unknown key(s) {unknown} for {kind.__name__}; valid: {sorted(names)}"
                )
            return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}, **extra)

        speed = d.pop("speed", None) or {}
        return cls(
            split=split,
            trained=make(dumps.AsTrained, d.pop("trained", None), split=split),
            context=make(ContextSettings, d.pop("context", None)),
            extrapolation=make(extrapolation.ExtrapolationSettings, d.pop("extrapolation", None), split=split),
            attention=make(attention_span.AttentionSettings, d.pop("attention", None), split=split),
            speed_attn_lens=tuple(speed.get("attn_lens", cls.speed_attn_lens)),
            speed_batch=int(speed.get("batch", cls.speed_batch)),
            speed_reps=int(speed.get("reps", cls.speed_reps)),
            recall=make(dumps.AsTrained, d.pop("recall", None), split=split),
            descriptive_seeds=d.pop("descriptive_seeds", cls.descriptive_seeds),
            device=str(d.pop("device", None) or "cpu"),
            level=float(d.pop("level", cls.level)),
            smoke=bool(d.pop("smoke", False)),
        )


def settings_line(runs: list[Run]) -> str:
    r = runs[0]
    m = r.config["model"]
    steps = sorted({int((x.results or {}).get("steps") or x.config["trainer"].get("max_steps") or 0) for x in runs})
    return (
        f"corpus `{r.corpus_name}` ({r.unit} level), {m['n_layer']} layers x d_model {m['d_model']} ({m['n_head']} "
        f"heads), segment L = {r.segment_len}, memory M = "
        f"{', '.join(str(v) for v in sorted({x.mem_len for x in runs if x.mem_len})) or 'none'}, training episodes "
        f"T = {r.episode_len or 'whole stream'}, batch {r.config['data']['batch_size']}, "
        f"{', '.join(map(str, steps))} steps"
    )


def _language_group(group: list[Run], s: ReportSettings, out: Path, log) -> dict:
    """Every measurement of one corpus's runs: dumps, evidence, RECL, extrapolation, attention."""
    cell_runs = cells(group)
    trained = {}
    for i, r in enumerate(group, 1):
        log(f"  as trained [{i}/{len(group)}] {r.label}")
        trained[r.name] = dumps.as_trained(r, s.trained, out / "dumps" / "as_trained" / f"{r.name}.npz", log)
    grid = s.context.grid(group)
    contexts = sorted(set(grid) | {r.train_attention_length for r in group if 0 < r.train_attention_length <= grid[-1]})
    window_max = s.context.window_max or 2 * max(r.segment_len for r in group)
    ctx_settings = dumps.AtContexts(tuple(contexts), s.split, s.context.n_rows, s.context.n_score, window_max)
    at_c = {}
    for i, r in enumerate(group, 1):
        log(f"  attention lengths {contexts[0]}..{contexts[-1]} [{i}/{len(group)}] {r.label}")
        at_c[r.name] = dumps.at_contexts(r, ctx_settings, out / "dumps" / "contexts" / f"{r.name}.npz", log)
    log("  RECL (bootstrap over documents and seeds)")
    k = [contexts.index(c) for c in grid]
    per_seed = {c: np.stack([at_c[r.name].loss[k][:, at_c[r.name].scored] for r in g]) for c, g in cell_runs.items()}
    ctx_docs = dumps.same_tokens(at_c)
    recl_res = recl(per_seed, grid, ctx_docs, n_boot=s.context.n_boot, level=s.level)
    few = [r for g in cell_runs.values() for r in g[: s.descriptive_seeds or len(g)]]  # descriptive: fewer seeds
    ext = extrapolation.analyze(few, out / "extrapolation", s.extrapolation, log=log)
    att = attention_span.analyze(few, out / "attention", s.attention, log=log)
    ev = {
        "as_trained": evidence.as_trained(cell_runs, trained),
        "attention_gain": evidence.attention_gain(cell_runs, at_c),
    }
    few_cells = {c: g[: s.descriptive_seeds or len(g)] for c, g in cell_runs.items()}
    if (hz := evidence.horizon_past(few_cells, ext.tokens)) is not None:
        ev["horizon_past"] = hz
    return dict(
        cells=cell_runs,
        few_cells=few_cells,
        trained=trained,
        at_c=at_c,
        grid=grid,
        recl=recl_res,
        ext=ext,
        att=att,
        evidence=ev,
    )


def _recall_group(group: list[Run], s: ReportSettings, out: Path, log) -> tuple[Section, dict]:
    cell_runs = cells(group)
    trained = {}
    for i, r in enumerate(group, 1):
        log(f"  recall as trained [{i}/{len(group)}] {r.label}")
        trained[r.name] = dumps.as_trained(r, s.recall, out / "dumps" / "recall" / f"{r.name}.npz", log)
    acc = pd.concat([recall.accuracy_by_distance(r, trained[r.name]) for r in group], ignore_index=True)
    write_csv(acc, out / "recall" / "recall_accuracy.csv")
    ev = evidence.recall_beyond(cell_runs, trained)
    table = recall_section.table(acc, ev.cells if ev else {}, ev.documents if ev else None)
    figure = plots.recall_accuracy(acc, out / "recall" / "recall_accuracy.png")
    sec = recall_section.section(acc, table, figure, settings_line(group), s.recall.n_streams, s.recall.n_tokens)
    return sec, ({"recall_beyond": ev} if ev else {})


def _preamble(runs: list[Run], s: ReportSettings, device: str, meta: dict[str, Any]) -> list[str]:
    lines = [
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `posenc_lab_analysis.report` on "
        f"{platform.machine()} ({platform.processor() or 'cpu'}), Python {platform.python_version()}, analyses on "
        f"{device}. {len(runs)} runs." + (f" {meta['command']}" if meta.get("command") else "")
    ]
    if s.smoke:
        lines.append(
            "**This is a smoke run** (`ablate.smoke`): the models are too small and too briefly trained for their "
            "differences to mean anything. It checks the pipeline end to end and judges no verdict."
        )
    if meta.get("notes"):
        lines.append("\n".join(f"- {n}" for n in meta["notes"]))
    by_n: dict[int, list[str]] = {}
    for cell, group in cells(runs).items():
        by_n.setdefault(len(group), []).append(cell)
    lines.append(
        "Seeds per cell: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(by_n.items(), reverse=True))
        + ". A cell with one seed has intervals over the text only (its training seed's variation is not in them)."
    )
    return lines


def _remove_stale_temporaries(out: Path) -> None:
    """Temporary files a killed report left (io.atomic_path names them .<name>.*.tmp*)."""
    for p in out.rglob(".*.tmp*"):
        if p.is_file():
            p.unlink(missing_ok=True)


def build_report(
    runs: list[Run],
    out: Path,
    settings: ReportSettings | None = None,
    title: str = "posenc-lab ablation",
    meta: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    speed: bool = True,
    paper_path: Path | None = None,
) -> Path:
    """Run every analysis on ``runs`` and write ``out/report.md`` with its CSVs and PNGs.
    meta: command (a line), notes (bullets), smoke (bool: overrides settings.smoke)."""
    s = settings or ReportSettings()
    meta = meta or {}
    if meta.get("smoke") is not None:
        s = replace(s, smoke=bool(meta["smoke"]))
    cells(runs)  # refuses two runs of one cell with the same seed, before any compute
    device = set_device(s.device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out)
    config = verdicts.paper(paper_path)
    by_corpus: dict[str, list[Run]] = {}
    for r in runs:
        by_corpus.setdefault(r.corpus_key, []).append(r)
    lm_groups = [g for g in by_corpus.values() if g[0].group is None]
    recall_groups = [g for g in by_corpus.values() if g[0].group == "recall"]

    sections: list[Section] = []
    all_evidence: dict = {}
    first = None
    for n, group in enumerate(lm_groups):
        sub, suffix = (out, "") if len(lm_groups) == 1 else (out / group[0].corpus_name, f"_{group[0].corpus_name}")
        log(f"analysis: {len(group)} runs on {group[0].corpus_name}")
        m = _language_group(group, s, sub, log)
        unit = group[0].unit
        unit_name, scale = figure_scale(unit)
        fig = figure_name(unit)
        if n == 0:
            first, all_evidence = (group, m, unit_name, scale), dict(m["evidence"])
            sections.append(data_section.section(group[0], next(iter(m["trained"].values())), s.split, len(group)))
        n_trained = int(next(iter(m["trained"].values())).scored.sum())
        t6 = table6_section.rows(
            m["cells"], m["trained"], m["at_c"], m["evidence"]["as_trained"].documents, scale, fig, m["recl"].table
        )
        sections.append(
            table6_section.section(t6, fig, unit_name, settings_line(group), f"{n_trained:,} tokens", suffix)
        )
        ctx_docs = dumps.same_tokens(m["at_c"])
        sections.append(
            recl_section.section(
                m["recl"],
                m["cells"],
                m["grid"],
                len(ctx_docs),
                len(np.unique(ctx_docs)),
                s.context.n_boot,
                s.level,
                sub,
                config.get("recl") or (),
                suffix,
            )
        )
        sections.append(
            extrapolation_section.section(
                m["ext"], m["few_cells"], s.extrapolation, scale, fig, unit_name, sub / "extrapolation", suffix
            )
        )
        sections.append(attention_section.section(m["att"], s.attention, suffix))
    for group in recall_groups:
        log(f"analysis: {len(group)} recall runs")
        sec, ev = _recall_group(group, s, out, log)
        sections.append(sec)
        all_evidence.update(ev)
    if speed and (lm_groups or recall_groups):
        group = (lm_groups or recall_groups)[0]
        timed = [r for r in group if r.scheme == config.get("proposed")] or group
        log("analysis: evaluation speed")
        df, figs = eval_speed.analyze(
            timed[0].model(),
            s.speed_attn_lens,
            out / "eval_speed",
            timed[0].segment_len,
            s.speed_batch,
            s.speed_reps,
            log=log,
        )
        sections.append(
            speed_section.section(
                df, figs, timed[0].label, timed[0].segment_len, s.speed_batch, config.get("speed", "")
            )
        )
    unit_name, scale = (first[2], first[3]) if first else ("nats", 1.0)
    judged, sanity = verdicts.judge(config, all_evidence, smoke=s.smoke)
    notes = (
        [f"Verdicts on corpus `{first[0][0].corpus_name}`; the other corpora are descriptive."]
        if len(lm_groups) > 1
        else []
    )
    line = ""
    if first and "as_trained" in all_evidence:  # the verdicts again without the tokens that could be recited
        group, m = first[0], first[1]
        shared = data_section.shared_scored(group[0], next(iter(m["trained"].values())), s.split)
        kept = evidence.restricted(all_evidence["as_trained"], ~shared)
        again = verdicts.recheck(config, judged, {"as_trained": kept})
        line = verdicts_section.robustness(again, float((~shared).mean()), WINDOW, scale, unit_name)
    sections.insert(1 if first else 0, verdicts_section.section(judged, sanity, scale, unit_name, s.smoke, notes, line))
    sections.append(
        Section(
            "!Files",
            "Every table is the CSV named in its caption (full precision); figures are the PNGs shown. "
            "Runs: " + ", ".join(f"`{r.path}`" for r in runs) + ".",
        )
    )
    return render(sections, out, title, _preamble(runs, s, device, meta))


def preset_analysis(experiment: str) -> tuple[dict, bool]:
    """(the ``ablate.analysis`` block, ``ablate.smoke``) of an ablation preset (conf/ablate.yaml, experiment=NAME)."""
    cfg = compose("ablate", [f"experiment={experiment}"])
    return OmegaConf.to_container(cfg.ablate.analysis, resolve=True), bool(cfg.ablate.get("smoke", False))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", help="run directories or folders of runs (Hydra multirun, ablation runs/)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--title", default="posenc-lab ablation report")
    p.add_argument("--experiment", help="take the analysis settings from this ablation preset (e.g. quick, ablation)")
    p.add_argument("--wandb", metavar="PROJECT", help="also log the report's tables and figures to this wandb project")
    p.add_argument("--no-speed", action="store_true", help="skip the evaluation-speed timing")
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    try:
        settings = None
        if a.experiment:
            analysis, smoke = preset_analysis(a.experiment)
            settings = ReportSettings.from_dict({**analysis, "smoke": smoke})
        runs = find_runs(a.runs)
        command = " ".join(["python -m posenc_lab_analysis.report", *map(str, a.runs), "--out", str(a.out)])
        path = build_report(
            runs, a.out, settings, title=a.title, speed=not a.no_speed, meta={"command": f"Command: `{command}`."}
        )
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if a.wandb:
        from .wandb_upload import upload  # wandb loads only when asked for

        upload(path.parent, a.runs, project=a.wandb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
