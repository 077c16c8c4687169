"""``posenc-lab ablate [experiment=NAME] [overrides]``: the main job.

Trains the five mission schemes (sinusoid, learned, global_sinusoid, shaw, xl) with and without
memory on the embedded default corpus (pystdlib), plus the loss variants and the optional recall
grid that the preset asks for, then runs every analysis and writes the report:

    <ablate.out>/runs/<scheme>_mem<M>_<loss>/     one `posenc-lab train` run directory each
    <ablate.out>/report/report.md                  the report, its CSVs and PNGs

Config: conf/ablate.yaml (which composes conf/train.yaml) and a preset from conf/experiment/
(`ablation` by default, `quick` in <= 3 minutes on 2 CPU cores, `wt103_table6` for the paper's
setting on GPUs). Each run is composed exactly as
``posenc-lab train experiment=NAME <overrides> posenc=S model.mem_len=M model.loss_recent_frac=F``.

It resumes: a run whose results.json exists is reused (its config must match), an interrupted one
continues from its last checkpoint. Progress is printed run by run.

    posenc-lab ablate experiment=quick
    posenc-lab ablate experiment=ablation ablate.out=runs/my_ablation trainer.max_steps=800
    posenc-lab ablate --cfg experiment=quick        # print the composed config and the run plan
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from posenc_lab import config_dir

CONF_DIR = config_dir()
# Keys that decide what a run is: a finished run is reused only if these match.
IDENTITY = ("posenc", "model", "data", "optim", "seed")


@dataclass
class RunSpec:
    name: str
    group: str  # "main" | "recall"
    scheme: str
    mem_len: int
    loss_frac: float
    overrides: list[str]

    @property
    def label(self) -> str:
        loss = "full" if self.loss_frac >= 1 else "half" if self.loss_frac == 0.5 else f"recent {self.loss_frac:g}"
        return f"{self.scheme}, mem {self.mem_len}, {loss} loss" + (" (recall)" if self.group == "recall" else "")


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    flags = [a for a in argv if a.startswith("--")]
    return flags, [a for a in argv if not a.startswith("--")]


def compose(name: str, overrides: Sequence[str]) -> DictConfig:
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return hydra_compose(name, overrides=list(overrides))


def experiment_of(overrides: Sequence[str]) -> str:
    for o in overrides:
        if o.startswith("experiment="):
            return o.split("=", 1)[1]
    return "ablation"


def train_overrides(overrides: Sequence[str]) -> list[str]:
    """The user's overrides that concern training (not the ablate block)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("ablate.") and not o.startswith("experiment=")]


def plan(cfg: DictConfig, user: Sequence[str]) -> list[RunSpec]:
    """The grid of runs: schemes x recurrence (full loss), the half-loss variants, the recall grid."""
    a = cfg.ablate
    base = [f"experiment={experiment_of(user)}", *train_overrides(user)]
    specs: list[RunSpec] = []

    raw_scheme_overrides = OmegaConf.to_container(a.scheme_overrides, resolve=False) if a.get("scheme_overrides") else {}

    def add(group: str, scheme: str, recurrent: bool, frac: float, head: list[str], mem: int, group_cfg: DictConfig):
        M = mem if recurrent else 0
        loss = "full" if frac >= 1 else "half" if frac == 0.5 else f"recent{frac:g}"
        name = f"{'recall_' if group == 'recall' else ''}{scheme}_mem{M}_{loss}"
        # ${...} in a scheme override resolves against the run's own group config (main or recall)
        per_scheme = [_resolve_in(group_cfg, o) for o in raw_scheme_overrides.get(scheme) or []]
        specs.append(RunSpec(name, group, scheme, M, frac,
                             [*head, f"posenc={scheme}", *per_scheme, f"model.mem_len={M}",
                              f"model.loss_recent_frac={frac}"]))

    mem = int(cfg.model.mem_len)
    if mem < 1 and any(a.recurrence):
        raise ValueError("ablate: the runs with memory need model.mem_len >= 1 in the preset (got "
                         f"{mem}); set model.mem_len or ablate.recurrence=[false]")
    for scheme in a.schemes:
        for rec in a.recurrence:
            add("main", scheme, bool(rec), 1.0, base, mem, cfg)
    half = a.get("half_loss") or {}
    for scheme in half.get("schemes") or []:
        for rec in half.get("recurrence") or [True]:
            add("main", scheme, bool(rec), 0.5, base, mem, cfg)
    recall = a.get("recall") or {}
    if recall.get("schemes"):
        head = [f"experiment={recall.get('experiment') or 'recall'}", *train_overrides(user),
                *(recall.get("overrides") or [])]
        rcfg = compose("train", head)
        for scheme in recall.schemes:
            for rec in recall.get("recurrence") or [True, False]:
                add("recall", scheme, bool(rec), 1.0, head, int(rcfg.model.mem_len), rcfg)
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"ablate: the grid names runs twice: {sorted(dup)}")
    return specs


def _resolve_in(cfg: DictConfig, text: str) -> str:
    """Resolve the ${...} interpolations of ``text`` against ``cfg``."""
    if "${" not in text:
        return text
    node = OmegaConf.create({"root": OmegaConf.to_container(cfg, resolve=False), "value": text.replace("${", "${root.")})
    return str(node.value)


def _identity(cfg) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    out = {k: c.get(k) for k in IDENTITY}
    out["max_steps"] = (c.get("trainer") or {}).get("max_steps")
    return out


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} (finished run) vs {vb!r} (now)")
    return out


def train_one(spec: RunSpec, run_dir: Path, retrain: bool, log) -> tuple[str, float]:
    """Train one run (or reuse it); returns (status, seconds)."""
    import json
    import shutil

    import yaml
    from posenc_lab.train import train

    cfg = compose("train", [*spec.overrides, f"run_dir={run_dir}"])
    with open_dict(cfg):
        cfg.pop("ablate", None)
    done = run_dir / "results.json"
    if done.is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file() and not retrain:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        diff = _diff(_identity(saved), _identity(cfg))
        if diff:
            raise ValueError(f"ablate: {run_dir} holds a finished run with other settings ({'; '.join(diff[:6])}). "
                             f"Use another ablate.out, or ablate.retrain=true to train it again")
        return "reused", float(json.loads(done.read_text()).get("wall_time_s") or 0.0)
    if retrain and run_dir.exists():
        shutil.rmtree(run_dir)
    resumed = (run_dir / "checkpoints" / "last.ckpt").is_file()
    start = time.perf_counter()
    if "ddp" in str(cfg.trainer.get("strategy") or ""):
        # DDP launches its ranks by re-running the command line, so each run gets its own
        # `posenc_lab.train` process rather than re-running the whole ablation per rank.
        import subprocess

        subprocess.run([sys.executable, "-m", "posenc_lab.train", *spec.overrides, f"run_dir={run_dir}"], check=True)
    else:
        train(cfg)
    return ("resumed" if resumed else "trained"), time.perf_counter() - start


def _quiet() -> None:
    """Keep the progress readable: Lightning's per-run banners (accelerator, tips) off."""
    import lightning.pytorch  # noqa: F401 - it sets its loggers' levels on import; override after

    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero",
                 "lightning.fabric.utilities.rank_zero", "posenc_lab.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for msg in (".*IterableDataset.*has `__len__` defined.*", ".*isinstance\\(treespec, LeafSpec\\).*",
                ".*limit_test_batches=1.0.*", ".*does not have many workers.*", ".*litlogger.*"):
        warnings.filterwarnings("ignore", message=msg)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags, overrides = _split_argv(argv)
    if "--help" in flags or "-h" in argv:
        print(__doc__)
        return 0
    unknown = [f for f in flags if f not in ("--cfg", "--plan")]
    if unknown:
        print(f"posenc-lab ablate: unknown option(s) {unknown}; options: --cfg, --plan, --help; the rest are "
              f"Hydra overrides (experiment=NAME, ablate.KEY=VALUE, any training key)", file=sys.stderr)
        return 2
    try:
        cfg = compose("ablate", overrides)
        specs = plan(cfg, overrides)
    except Exception as e:  # noqa: BLE001 - Hydra raises several kinds for bad overrides
        print(f"posenc-lab ablate: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    a = cfg.ablate
    out = Path(a.out).resolve()
    if "--cfg" in flags or "--plan" in flags:
        if "--cfg" in flags:
            print(OmegaConf.to_yaml(cfg))
        print(f"# {len(specs)} runs into {out}/runs:")
        for sp in specs:
            print(f"#   {sp.name}: posenc-lab train {' '.join(sp.overrides)}")
        return 0

    import torch

    if a.get("threads"):
        torch.set_num_threads(int(a.threads))
    _quiet()
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    log(f"ablate {a.name}: {len(specs)} runs -> {out}/runs; report -> {out}/report "
        f"(torch threads: {torch.get_num_threads()})")
    times = []
    for i, spec in enumerate(specs, 1):
        run_dir = out / "runs" / spec.name
        eta = ""
        trained = [t for st, t in times if st != "reused"]
        if trained:
            left = sum(1 for sp in specs[i - 1:] if not (out / "runs" / sp.name / "results.json").is_file())
            eta = f", about {left * sum(trained) / len(trained) / 60:.1f} min of training left"
        log(f"[{i}/{len(specs)}] {spec.label}: {'reusing' if (run_dir / 'results.json').is_file() and not a.retrain else 'training'}{eta}")
        try:
            status, seconds = train_one(spec, run_dir, bool(a.retrain), log)
        except Exception as e:  # noqa: BLE001 - report which run failed, keep the finished ones
            log(f"[{i}/{len(specs)}] {spec.name} FAILED: {type(e).__name__}: {e}")
            log(f"finished runs are kept in {out}/runs; rerun the same command to resume")
            return 1
        times.append((status, seconds))
        import json

        res = json.loads((run_dir / "results.json").read_text())
        val = res.get("val") or {}
        fig = next((f"{k} {val[k]:.3f}" for k in ("bpt", "ppl", "acc") if k in val), "")
        log(f"[{i}/{len(specs)}] {spec.name}: {status} ({seconds:.0f} s, {res.get('steps')} steps){', val ' + fig if fig else ''}")

    from .report import ReportSettings, build_report
    from .runs import load_run, sort_runs

    runs = sort_runs([load_run(out / "runs" / sp.name) for sp in specs])
    settings = ReportSettings.from_dict(OmegaConf.to_container(a.analysis, resolve=True))
    command = "posenc-lab ablate " + " ".join(overrides) if overrides else "posenc-lab ablate"
    notes = [f"Preset `{experiment_of(overrides)}` ({len(specs)} runs, "
             f"{sum(t for st, t in times if st == 'trained'):.0f} s of training in this invocation, "
             f"{sum(1 for st, _ in times if st == 'reused')} finished runs reused)."]
    try:
        path = build_report(runs, out / "report", settings, title=f"posenc-lab ablation report: {a.name}",
                            meta={"command": f"Command: `{command}`.", "notes": notes}, log=log)
    except Exception as e:  # noqa: BLE001
        log(f"report FAILED: {type(e).__name__}: {e}")
        raise
    if a.get("wandb_project"):
        from .report import log_to_wandb

        log_to_wandb(path.parent, str(a.wandb_project), [out / "runs"], group=f"ablate-{a.name}")
        log(f"logged the report to wandb project {a.wandb_project}")
    log(f"done in {(time.perf_counter() - t0) / 60:.1f} min: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
