"""The ablation report: one Markdown file with embedded PNGs and every table's CSV beside it,
shaped like the Transformer-XL ablation (Table 6): scheme x recurrence x training loss, the
loss at the training attention length ("init"), the best over evaluation attention lengths and
that length, RECL, the extrapolation figures and the attention spans.

Each analysis returns a ``sections.Section`` (title, text, tables, figures, findings) computed
from its own numbers; this module runs the analyses and assembles their sections. Every loss
difference the report states carries a paired bootstrap interval (``analysis/stats.py``), and each
of the paper's findings is "reproduced", "contradicted" or "inconclusive" from its interval.

    python -m posenc_lab_analysis.report RUNS_DIR [RUNS_DIR...] --out DIR
RUNS_DIR: run directories or folders holding runs, e.g. a Hydra multirun folder
(runs/multirun/DATE/TIME) or an ablation's runs/ folder.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from posenc_lab.tables import write_csv

from . import ablation_table, attention_span, effective_context, eval_speed, extrapolation
from .runs import Run, RunError, add_threads_argument, apply_threads, find_runs
from .sections import Figure, Section, Table, render


@dataclass
class ReportSettings:
    context: effective_context.ContextSettings = field(default_factory=effective_context.ContextSettings)
    extrapolation: extrapolation.ExtrapolationSettings = field(default_factory=extrapolation.ExtrapolationSettings)
    attention: attention_span.AttentionSettings = field(default_factory=attention_span.AttentionSettings)
    speed_attn_lens: tuple[int, ...] = (64, 128, 256, 512)
    speed_batch: int = 4
    speed_min_seconds: float = 0.5
    recall_rows: int = 16
    recall_tokens: int = 4096
    split: str = "valid"
    device: str = "cpu"  # where the analyses run the models: cpu, cuda, auto
    block: int = 32  # bootstrap block: consecutive scored tokens of a row (analysis/stats.py)
    n_boot: int = 2000  # bootstrap replicates of every loss difference
    level: float = 0.95  # coverage of every interval
    smoke: bool = False  # a smoke run (ablate.smoke): the report draws no conclusions

    def __post_init__(self):
        """Bad bootstrap settings fail here, naming the key, before any analysis runs."""
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"ablate.analysis.bootstrap.block must be an integer >= 1 (tokens), got {self.block!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"ablate.analysis.bootstrap.level must be in (0, 1), e.g. 0.95, got {self.level!r}")
        if self.n_boot < 100:
            raise ValueError(f"ablate.analysis.bootstrap.n_boot must be >= 100 replicates, got {self.n_boot!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReportSettings:
        """From the ``ablate.analysis`` block of conf/ablate.yaml."""
        split = d.get("split", "valid")
        boot = d.get("bootstrap") or {}
        block = int(boot.get("block", cls.block))
        level = float(boot.get("level", cls.level))
        ctx = {"block": block, "level": level, **(d.get("context") or {})}
        ext = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in (d.get("extrapolation") or {}).items()}
        att = dict(d.get("attention") or {})
        speed = d.get("speed") or {}
        recall = d.get("recall") or {}
        return cls(
            context=effective_context.ContextSettings(split=split, **ctx),
            extrapolation=extrapolation.ExtrapolationSettings(split=split, **ext),
            attention=attention_span.AttentionSettings(split=split, **att),
            speed_attn_lens=tuple(speed.get("attn_lens", cls.speed_attn_lens)),
            speed_batch=int(speed.get("batch", cls.speed_batch)),
            speed_min_seconds=float(speed.get("min_seconds", cls.speed_min_seconds)),
            recall_rows=int(recall.get("n_rows", cls.recall_rows)),
            recall_tokens=int(recall.get("n_tokens", cls.recall_tokens)),
            split=split,
            device=str(d.get("device") or "cpu"),
            block=block,
            n_boot=int(boot.get("n_boot", cls.n_boot)),
            level=level,
            smoke=bool(d.get("smoke", False)),
        )


# ---- the report ---------------------------------------------------------------------------------


def _settings_line(runs: list[Run]) -> str:
    r = runs[0]
    m = r.config["model"]
    steps = sorted({int((x.results or {}).get("steps") or x.config["trainer"].get("max_steps") or 0) for x in runs})
    T = r.episode_len
    return (
        f"corpus `{r.corpus_name}` ({r.unit} level), model {m['n_layer']} layers x d_model {m['d_model']} "
        f"({m['n_head']} heads), segment L = {r.segment_len}, memory M = "
        f"{', '.join(str(v) for v in sorted({x.mem_len for x in runs if x.mem_len})) or 'none'}, training episodes "
        f"T = {T if T else 'whole stream'}, batch {r.config['data']['batch_size']}, "
        f"{', '.join(map(str, steps))} steps, lr {r.config.get('optim', {}).get('lr')}"
    )


def _recall_section(group: list[Run], s: ReportSettings, out: Path, log) -> Section:
    from . import plots

    log(f"analysis: recall, {len(group)} runs")
    sub = out / "recall"
    sub.mkdir(parents=True, exist_ok=True)
    acc = pd.concat(
        [effective_context.recall_accuracy(r, s.split, s.recall_rows, s.recall_tokens) for r in group],
        ignore_index=True,
    )
    write_csv(acc, sub / "recall_accuracy.csv")
    path = plots.recall_accuracy(acc, sub / "recall_accuracy.png")
    text = (
        f"Settings: {_settings_line(group)}. A value is planted and must be answered D tokens later; "
        f"accuracy of the answers by distance (bins of {effective_context.DISTANCE_BIN}), evaluated as trained "
        f"over {s.recall_rows} streams x {s.recall_tokens} tokens. Per bin: `recall/recall_accuracy.csv`. "
        f"Intervals: {s.level:.0%} Wilson intervals of a proportion and Newcombe's of a difference of two, the "
        f"answers taken as independent trials."
    )
    t = effective_context.recall_table(acc, s.level)
    return Section(
        "Recall probe",
        text,
        [
            Table(
                "table_recall",
                t,
                "answer accuracy within one segment (D < L) and beyond it (D >= L)",
                {"acc_within_L": 4, "acc_beyond_L": 4, "beyond_lo": 4, "beyond_hi": 4, "chance": 4},
            )
        ],
        [Figure(path, "recall accuracy by distance (dotted: segment length; dashed: chance)")],
        effective_context.recall_findings(t, s.smoke),
    )


def _preamble(runs: list[Run], s: ReportSettings, device: str, meta: dict[str, Any]) -> list[str]:
    from .runs import cells

    lines = [
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `analysis/report.py` on "
        f"{platform.machine()} ({platform.python_implementation()} {platform.python_version()}), analyses on "
        f"{device}. {len(runs)} runs." + (f" {meta['command']}" if meta.get("command") else "")
    ]
    if s.smoke:
        lines.append(
            "**This is a smoke run** (`ablate.smoke`): the models are too small and too briefly trained for "
            "their differences to mean anything. It checks that the pipeline works end to end; it draws no "
            "conclusions, and no finding below is judged."
        )
    if meta.get("notes"):
        lines.append("\n".join(f"- {n}" for n in meta["notes"]))
    seeds: dict[int, list[str]] = {}
    for cell, group in cells(runs).items():
        seeds.setdefault(len(group), []).append(cell)
    lines.append(
        "Seeds per cell (runs equal but for `seed`): "
        + "; ".join(
            f"{k} seed{'s' if k > 1 else ''}: {len(v)} cell{'s' if len(v) > 1 else ''}"
            + (f" ({', '.join(v)})" if k > 1 else "")
            for k, v in sorted(seeds.items(), reverse=True)
        )
        + "."
    )
    lines.append(
        "Conventions. Losses are shown in bits per byte (byte corpora), bits per character, or perplexity "
        "(word corpora) where named `bpb`/`bpc`/`ppl`; figures plot bits (or nats per word). *Attention length* A: "
        "every scored token sees exactly A previous tokens. Runs trained with memory are evaluated with memory A "
        "and the same-length mask; runs trained without memory with a sliding window of A tokens. *init* is the loss "
        "at the training attention length (M with memory; L - 1 without), *best* the lowest over the evaluated "
        "lengths. Each analysis scores the same tokens of the validation split for every run. "
        f"Uncertainty: every loss difference is given as `estimate [low, high]`, a {s.level:.0%} paired bootstrap "
        f"interval: the scored tokens are cut into blocks of {s.block} consecutive tokens of a row (neighbouring "
        f"tokens are correlated), the blocks are resampled with replacement ({s.n_boot} replicates), the same blocks "
        f"for every run, and with several seeds the seeds of each cell too (the cell's figure is the mean over its "
        f"seeds). A finding of the paper is **reproduced** when the interval lies entirely on the predicted side, "
        f"**contradicted** when entirely on the other side, **inconclusive** when it holds zero; no threshold. With "
        f"one seed per cell the interval covers the evaluation text only, not the training seed; the findings are "
        f"not corrected for multiple comparisons."
    )
    return lines


def build_report(
    runs: list[Run],
    out: Path,
    settings: ReportSettings | None = None,
    title: str = "posenc-lab ablation",
    meta: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    speed: bool = True,
) -> Path:
    """Run every analysis on ``runs`` and write ``out/report.md`` with its CSVs and PNGs.
    meta: command (a line), notes (bullets), smoke (bool: overrides settings.smoke)."""
    from .runs import cells, set_device

    s = settings or ReportSettings()
    meta = meta or {}
    if meta.get("smoke") is not None:
        s = replace(s, smoke=bool(meta["smoke"]))
    cells(runs)  # refuses two runs of one cell with the same seed, before any compute
    device = set_device(s.device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paper = ablation_table.paper()
    by_corpus: dict[str, list[Run]] = {}
    for r in runs:
        by_corpus.setdefault(r.corpus_key, []).append(r)
    lm_groups = [g for g in by_corpus.values() if g[0].corpus_name != "recall"]
    recall_groups = [g for g in by_corpus.values() if g[0].corpus_name == "recall"]

    sections: list[Section] = []
    ctx_settings = replace(s.context, block=s.block, level=s.level)
    for group in lm_groups:
        sub = out if len(lm_groups) == 1 else out / group[0].corpus_name
        sub.mkdir(parents=True, exist_ok=True)
        suffix = "" if len(lm_groups) == 1 else f"_{group[0].corpus_name}"
        log(f"analysis: {len(group)} runs on {group[0].corpus_name}")
        ctx = effective_context.analyze(group, sub / "effective_context", ctx_settings, log=log)
        ext = extrapolation.analyze(group, sub / "extrapolation", s.extrapolation, log=log)
        att = attention_span.analyze(group, sub / "attention", s.attention, log=log)
        cl = ablation_table.cell_losses(group, ctx.dumps, s.block, s.n_boot, s.level)
        sections.append(
            ablation_table.section(group, cl, ctx.recl, _settings_line(group), len(sections) + 2, suffix, s.smoke)
        )
        sections.append(effective_context.section(ctx, ctx_settings, len(group), paper.get("recl") or (), suffix))
        sections.append(
            extrapolation.section(
                group,
                ext,
                s.extrapolation,
                (s.block, s.n_boot, s.level),
                suffix,
                s.smoke,
                paper.get("past_episodes"),
                proposed=paper.get("proposed"),
            )
        )
        sections.append(attention_span.section(att, s.attention, suffix))

    if speed and lm_groups + recall_groups:
        group = (lm_groups or recall_groups)[0]
        timed = [r for r in group if r.scheme == paper.get("proposed")] or group
        log("analysis: evaluation speed")
        df, figs = eval_speed.analyze(
            timed[0].model(),
            s.speed_attn_lens,
            out / "eval_speed",
            timed[0].segment_len,
            s.speed_batch,
            s.speed_min_seconds,
            log=log,
        )
        sections.append(
            eval_speed.section(df, figs, timed[0].label, timed[0].segment_len, s.speed_batch, paper.get("speed", ""))
        )

    for group in recall_groups:
        sections.append(_recall_section(group, s, out, log))

    sections.append(
        Section(
            "!Files",
            "Every table above is the CSV named in its caption (full precision). Figures "
            "are the PNGs shown. Runs: " + ", ".join(f"`{r.path}`" for r in runs) + ".",
        )
    )
    return render(sections, out, title, _preamble(runs, s, device, meta))


def preset_analysis(experiment: str) -> tuple[dict, bool]:
    """(the ``ablate.analysis`` block, ``ablate.smoke``) of an ablation preset, composed by Hydra
    (conf/ablate.yaml with experiment=NAME)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from posenc_lab import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("ablate", overrides=[f"experiment={experiment}"])
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
    p.add_argument(
        "--experiment",
        help="take the analysis settings (grids, rows) from this ablation preset's "
        "ablate.analysis block, e.g. quick or ablation (default: built-in defaults)",
    )
    p.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="also log the report's tables and figures to this wandb project "
        "(analysis/wandb_upload.py; WANDB_MODE=offline works)",
    )
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
        command = " ".join(
            ["python -m posenc_lab_analysis.report", *map(str, a.runs), "--out", str(a.out)]
            + (["--experiment", a.experiment] if a.experiment else [])
        )
        path = build_report(
            runs, a.out, settings, title=a.title, speed=not a.no_speed, meta={"command": f"Command: `{command}`."}
        )
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if a.wandb:
        log_to_wandb(path.parent, a.wandb, a.runs)
    return 0


def log_to_wandb(report_dir: Path, project: str, runs: Sequence[Path] = (), group: str | None = None) -> str:
    """Log a report (tables, figures, the folder as an artifact) to wandb: analysis.wandb_upload."""
    from .wandb_upload import upload

    return upload(report_dir, runs, project=project, group=group)


if __name__ == "__main__":
    sys.exit(main())
