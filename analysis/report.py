"""The ablation report: one Markdown file with its figures and every table's CSV beside it.

The sections are a registry (``sections/``, one module each); ``ablate.analysis.sections`` in conf/ablate.yaml
states their order, once. This module holds what they share: the runs grouped by corpus (``Group``), each
group's per-token losses on the held-out split (``dumps``: as trained, and at controlled attention lengths) and
the evidence the verdicts judge (``evidence``), each computed once, when first asked for (the dumps in worker
processes with ``--jobs``: workers.py). The work runs in two passes: every section measures (each language
corpus, then each recall group, then the report-wide sections, in the stated order), then every section renders
in that order.

    python -m posenc_lab_analysis.report RUNS_DIR [RUNS_DIR...] --out DIR [--experiment NAME]
RUNS_DIR: run directories or folders holding runs (a Hydra multirun folder, an ablation's runs/ folder).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posenc_lab.compose import compose
from posenc_lab.errors import ConfigError, PosencLabError
from posenc_lab.metrics import figure_name, figure_scale

from . import dumps, evidence, verdicts
from .runs import Run, add_threads_argument, apply_threads, cells, find_runs, set_device
from .sections import CORPUS, RECALL, REPORT, SECTIONS, Part, Section, render, section_class
from .sections.speed import Speed
from .settings import PREFIX, conf_block, structured
from .workers import DumpWorkers


@dataclass
class Shared:
    """The keys of ``ablate.analysis`` every section may read (their values: conf/ablate.yaml)."""

    split: str  # the split that judges the verdicts
    device: str  # where the analyses run the models: cpu, cuda, auto
    level: float  # of every descriptive interval
    descriptive_seeds: int | None  # extrapolation and attention spans: the first seeds of each cell (None: all)
    trained: dumps.AsTrained
    context: dumps.ContextSettings
    sections: list[str]  # the report's sections, in order

    def __post_init__(self):
        if self.split not in ("val", "test"):
            raise ValueError(f"{PREFIX}.split must be val or test, got {self.split!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"{PREFIX}.level must be in (0, 1), e.g. 0.95, got {self.level!r}")
        for name in self.sections:
            section_class(name)


@dataclass
class ReportSettings:
    """``ablate.analysis``: the shared keys and each section's block (``ablate.analysis.<name>``)."""

    shared: Shared
    blocks: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, block: Mapping) -> ReportSettings:
        """From the ``ablate.analysis`` block of a composed config; a ConfigError in one line naming the key."""
        block = dict(block)
        own = {n: block.pop(n) for n in list(block) if n in SECTIONS and SECTIONS[n].Settings is not None}
        keys = [f.name for f in fields(Shared)]
        if unknown := sorted(set(block) - set(keys)):
            raise ConfigError(
                f"{PREFIX}.{unknown[0]} is not a key of {PREFIX}; its keys: {', '.join(sorted(keys))}, and the blocks "
                f"of the sections that take settings: {', '.join(n for n, c in SECTIONS.items() if c.Settings)}"
            )
        shared = structured(Shared, block, PREFIX)
        blocks = {n: structured(SECTIONS[n].Settings, b, f"{PREFIX}.{n}") for n, b in own.items()}
        for n in shared.sections:
            if SECTIONS[n].Settings is not None and n not in blocks:
                keys = ", ".join(f.name for f in fields(SECTIONS[n].Settings))
                raise ConfigError(f"{PREFIX}.{n} is missing: section {n} takes {keys} (add them to conf/ablate.yaml)")
        return cls(shared, blocks)

    @classmethod
    def defaults(cls) -> ReportSettings:
        """As conf/ablate.yaml states them, no preset applied."""
        return cls.read(conf_block())


class Group:
    """The runs of one corpus (``kind`` corpus) or of the recall probe (``kind`` recall), and what the sections
    share about them, computed once: their cells, as-trained and controlled-context dumps, the evidence."""

    def __init__(self, report: Report, runs: list[Run], kind: str, out: Path, suffix: str = ""):
        self.report, self.runs, self.kind, self.out, self.suffix = report, runs, kind, out, suffix
        self.cells = cells(runs)
        self.name = runs[0].corpus_name
        self.unit_name, self.scale = figure_scale(runs[0].unit)
        self.figure = figure_name(runs[0].unit)

    @property
    def few_cells(self) -> dict[str, list[Run]]:
        """Each cell's first ``descriptive_seeds`` runs (the descriptive analyses)."""
        n = self.report.settings.shared.descriptive_seeds
        return {c: g[: n or len(g)] for c, g in self.cells.items()}

    @property
    def settings_line(self) -> str:
        r, runs = self.runs[0], self.runs
        m = r.config["model"]
        steps = sorted({int((x.results or {}).get("steps") or x.config["trainer"].get("max_steps") or 0) for x in runs})
        memory = ", ".join(str(v) for v in sorted({x.mem_len for x in runs if x.mem_len})) or "none"
        return (
            f"corpus `{r.corpus_name}` ({r.unit} level), {m['n_layer']} layers x d_model {m['d_model']} "
            f"({m['n_head']} heads), segment L = {r.segment_len}, memory M = {memory}, training episodes "
            f"T = {r.episode_len or 'whole stream'}, batch {r.config['data']['batch_size']}, "
            f"{', '.join(map(str, steps))} steps"
        )

    def _dumps(self, compute: Callable, args: tuple, folder: str, what: str, first=None) -> dict:
        """run name -> ``compute(run, *args, path, log)`` for every run, kept in dumps/<folder>/<run>.npz; the
        report's worker processes compute them first where it has them (``first``: the key of the runs to start
        first, the longest), then each is read where it is kept."""
        paths = {r.name: self.out / "dumps" / folder / f"{r.name}.npz" for r in self.runs}
        order = sorted(self.runs, key=first) if first else self.runs
        done = self.report.workers.prefetch(compute, [(r, args, paths[r.name]) for r in order], what)
        out = {}
        for i, r in enumerate(self.runs, 1):
            if r.name not in done:
                self.report.log(f"  {what} [{i}/{len(self.runs)}] {r.label}")
            out[r.name] = compute(r, *args, paths[r.name], self.report.log)
        return out

    def as_trained(self, s: dumps.AsTrained, folder: str, what: str = "as trained") -> dict[str, dumps.TokenLosses]:
        """Every run evaluated as trained with ``s`` on the judging split (dumps kept in dumps/<folder>/)."""
        return self._dumps(dumps.as_trained, (s, self.report.settings.shared.split), folder, what)

    @cached_property
    def trained(self) -> dict[str, dumps.TokenLosses]:
        """run name -> its as-trained dump (``ablate.analysis.trained``)."""
        return self.as_trained(self.report.settings.shared.trained, "as_trained")

    @cached_property
    def grid(self) -> list[int]:
        """The attention lengths of RECL's gain curves (``ablate.analysis.context``)."""
        return self.report.settings.shared.context.grid(self.runs)

    @cached_property
    def at_contexts(self) -> dict[str, dumps.TokenLosses]:
        """run name -> its dump at every attention length of the grid and every run's training length."""
        s = self.report.settings.shared
        spec = s.context.evaluation(self.runs, s.split)
        what = f"attention lengths {spec.contexts[0]}..{spec.contexts[-1]}"
        # the runs without memory first: their fresh windows cost the most
        return self._dumps(dumps.at_contexts, (spec,), "contexts", what, first=lambda r: bool(r.recurrence))

    @cached_property
    def evidence(self) -> dict[str, verdicts.Evidence]:
        """The measures every language corpus has (as_trained, attention_gain); sections add theirs."""
        return {
            "as_trained": evidence.as_trained(self.cells, self.trained),
            "attention_gain": evidence.attention_gain(self.cells, self.at_contexts),
        }


class SectionContext:
    """What a section reads (``sections.base.Context``): its settings, the shared ones, its group (None for a
    report-wide section), the report, the other sections' measurements of the same group, and where it writes."""

    def __init__(self, report: Report, section: Section, group: Group | None):
        self.report, self.section, self.group = report, section, group
        self.settings = report.settings.blocks.get(section.name)
        self.shared = report.settings.shared
        self.out = group.out if group else report.out
        self.suffix = group.suffix if group else ""
        self.log = report.log

    def measured(self, name: str | None = None) -> Any:
        """Section ``name``'s measurement of this group (default: this section's), computed once."""
        return self.report.measured(name or self.section.name, self.group)

    def file(self, name: str) -> Path:
        """Where this section writes ``name`` (e.g. "extrapolation/x.png"): in its group's folder, the group's
        suffix before the extension; its folder is created."""
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.with_name(f"{path.stem}{self.suffix}{path.suffix}")

    @property
    def title(self) -> str:
        """The section's title, with its corpus where the report holds several."""
        return self.section.title + (f" ({self.suffix.strip('_')})" if self.suffix else "")


class Report:
    """The runs of one report, its groups and every section's measurement (``measured``)."""

    def __init__(self, runs, out: Path, settings: ReportSettings, paper: dict, smoke: bool, log: Callable):
        self.runs, self.out, self.settings, self.paper, self.smoke, self.log = runs, out, settings, paper, smoke, log
        by_corpus: dict[str, list[Run]] = {}
        for r in runs:
            by_corpus.setdefault(r.corpus_key, []).append(r)
        lm = [g for g in by_corpus.values() if g[0].group is None]
        several = len(lm) > 1
        self.corpora = [
            Group(self, g, CORPUS, out / g[0].corpus_name if several else out, f"_{g[0].corpus_name}" * several)
            for g in lm
        ]
        self.recalls = [Group(self, g, RECALL, out) for g in by_corpus.values() if g[0].group == RECALL]
        self.main = self.corpora[0] if self.corpora else None  # the corpus the verdicts judge on
        self.sections = {name: SECTIONS[name]() for name in settings.shared.sections}
        self._measured: dict[tuple[str, int], Any] = {}
        self.workers = DumpWorkers(log)  # computes the runs' dumps in parallel inside ``workers.running``

    def groups(self, scope: str) -> list[Group | None]:
        return {CORPUS: self.corpora, RECALL: self.recalls, REPORT: [None]}[scope]

    def measured(self, name: str, group: Group | None) -> Any:
        key = (name, id(group))
        if key not in self._measured:
            section = self.sections.get(name) or section_class(name)()
            self._measured[key] = section.measure(SectionContext(self, section, group))
        return self._measured[key]

    @cached_property
    def evidence(self) -> dict[str, verdicts.Evidence]:
        """measure -> Evidence for the verdicts: the main corpus's, then each listed section's of its groups."""
        out = dict(self.main.evidence) if self.main else {}
        for name, section in self.sections.items():
            groups = {CORPUS: [self.main] if self.main else [], RECALL: self.recalls}.get(section.scope, [])
            for group in groups:
                out.update(section.evidence(SectionContext(self, section, group), self.measured(name, group)))
        return out

    def measure(self) -> None:
        """Every listed section's measurement: each corpus, each recall group, then the report-wide ones."""
        for scope in (CORPUS, RECALL, REPORT):
            for group in self.groups(scope):
                if group is not None:
                    where = f"runs on {group.name}" if scope == CORPUS else "recall runs"
                    self.log(f"analysis: {len(group.runs)} {where}")
                for name, section in self.sections.items():
                    if section.scope == scope:
                        self.measured(name, group)

    def parts(self) -> list[Part]:
        """Every section rendered, in the stated order; a run of consecutive sections of one scope is rendered
        group by group (a corpus's table, RECL, ... then the next corpus's)."""
        names, out, i = list(self.sections), [], 0
        while i < len(names):
            scope = self.sections[names[i]].scope
            j = i
            while j < len(names) and self.sections[names[j]].scope == scope:
                j += 1
            for group in self.groups(scope):
                for name in names[i:j]:
                    section = self.sections[name]
                    ctx = SectionContext(self, section, group)
                    part = section.render(ctx, self.measured(name, group))
                    if part is not None:
                        out.append(_titled(part, ctx))
            i = j
        return out


def _titled(part: Part, ctx: SectionContext) -> Part:
    """The part with its section's title and numbering, and its tables named with the group's suffix."""
    part.title = part.title or ctx.title
    part.numbered = part.numbered and ctx.section.numbered
    for t in part.tables:
        t.name += ctx.suffix
    return part


def _preamble(runs: list[Run], device: str, smoke: bool, meta: dict[str, Any]) -> list[str]:
    lines = [
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `posenc_lab_analysis.report` on "
        f"{platform.machine()} ({platform.processor() or 'cpu'}), Python {platform.python_version()}, analyses on "
        f"{device}. {len(runs)} runs." + (f" {meta['command']}" if meta.get("command") else "")
    ]
    if smoke:
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
    without: Collection[str] = (),
    paper_path: Path | None = None,
    jobs: int = 1,
    threads: int | None = None,
) -> Path:
    """Run every section of ``settings`` (default: conf/ablate.yaml's) but those named in ``without`` on
    ``runs`` and write ``out/report.md`` with its CSVs and PNGs. meta: command (a line), notes (bullets), smoke
    (bool: a smoke run judges nothing). jobs: worker processes for the runs' dumps (``threads`` torch
    threads each; 1: all in this process)."""
    s = settings or ReportSettings.defaults()
    if without:
        s = ReportSettings(replace(s.shared, sections=[n for n in s.shared.sections if n not in without]), s.blocks)
    meta = meta or {}
    cells(runs)  # refuses two runs of one cell with the same seed, before any compute
    device = set_device(s.shared.device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out)
    report = Report(runs, out, s, verdicts.paper(paper_path), bool(meta.get("smoke")), log)
    with report.workers.running(jobs, threads):
        report.measure()
    return render(report.parts(), out, title, _preamble(runs, device, report.smoke, meta))


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
    p.add_argument(
        "--jobs", type=int, default=1, help="worker processes for the runs' dumps, --threads each (default 1: none)"
    )
    add_threads_argument(p)
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error(f"--jobs must be >= 1 (worker processes), got {a.jobs}")
    apply_threads(a.threads)
    try:
        settings, smoke = None, False
        if a.experiment:
            analysis, smoke = preset_analysis(a.experiment)
            settings = ReportSettings.read(analysis)
        runs = find_runs(a.runs)
        command = " ".join(["python -m posenc_lab_analysis.report", *map(str, a.runs), "--out", str(a.out)])
        path = build_report(
            runs,
            a.out,
            settings,
            title=a.title,
            without={Speed.name} if a.no_speed else (),
            meta={"command": f"Command: `{command}`.", "smoke": smoke},
            jobs=a.jobs,
            threads=a.threads or None,
        )
    except (PosencLabError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if a.wandb:
        from .wandb_upload import upload  # wandb loads only when asked for

        upload(path.parent, a.runs, project=a.wandb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
