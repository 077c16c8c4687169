"""Run directories as the analysis sees them: discovery (single runs, Hydra multirun trees,
ablation folders), their settings, their trained model and their evaluation data.

A run directory is what ``posenc-lab train`` writes: ``config.yaml`` (the resolved config),
``checkpoints/last.ckpt``, ``results.json`` (when finished). Everything here goes through
posenc_lab's public API (``posenc_lab.evaluate.load_model``, ``posenc_lab.data.load_corpus``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml

MISSION_SCHEMES = ("sinusoid", "learned", "global_sinusoid", "shaw", "xl")
# Row order of every table: the mission schemes first (absolute, then relative), then the rest.
SCHEME_ORDER = MISSION_SCHEMES + ("nope", "rope", "alibi", "t5")


class RunError(ValueError):
    """A run directory cannot be analysed; the message names the directory and what is missing."""


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    results: dict[str, Any] | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    # ---- settings -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def scheme(self) -> str:
        return str(self.config["posenc"]["name"])

    @property
    def mem_len(self) -> int:
        return int(self.config["model"]["mem_len"])

    @property
    def recurrence(self) -> bool:
        return self.mem_len > 0

    @property
    def loss_frac(self) -> float:
        return float(self.config["model"].get("loss_recent_frac", 1.0))

    @property
    def loss(self) -> str:
        """'full' or the recent fraction the training loss counted ('half' for 0.5)."""
        f = self.loss_frac
        return "full" if f >= 1.0 else "half" if f == 0.5 else f"recent {f:g}"

    @property
    def corpus_name(self) -> str:
        return str(self.config["data"]["name"])

    @property
    def corpus_key(self) -> str:
        """The corpus and its preparation options: runs compare only when this is equal."""
        opts = self.config["data"].get("corpus") or {}
        return self.corpus_name + (json.dumps(opts, sort_keys=True) if opts else "")

    @property
    def segment_len(self) -> int:
        return int(self.config["data"]["segment_len"])

    @property
    def episode_len(self) -> int | None:
        T = self.config["data"].get("episode_len")
        return None if T is None else int(T)

    @property
    def label(self) -> str:
        """e.g. 'xl, mem 64, full loss' (unique within an ablation)."""
        return f"{self.scheme}, mem {self.mem_len}, {self.loss} loss"

    @property
    def key(self) -> dict[str, Any]:
        """The columns that identify the run in every table."""
        return {"run": self.name, "scheme": self.scheme, "recurrence": "on" if self.recurrence else "off",
                "mem_len": self.mem_len, "loss": self.loss}

    @property
    def checkpoint(self) -> Path:
        ckpt = self.path / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise RunError(f"run {self.path}: no checkpoint at {ckpt} (the run did not finish or its checkpoints "
                           f"were removed); train it again (posenc-lab train run_dir={self.path} resumes) or leave "
                           f"it out")
        return ckpt

    # ---- model and data -------------------------------------------------------------------
    def model(self):
        """The trained MemoryTransformer in eval mode (loaded once), on the analysis device
        (``set_device``: the CPU unless asked otherwise)."""
        if "model" not in self._cache:
            from posenc_lab.evaluate import load_model

            self._cache["model"] = load_model(self.checkpoint).eval().to(analysis_device())
        return self._cache["model"]

    def corpus(self):
        return load_corpus_cached(self.corpus_name, self.config["data"].get("root"),
                                  self.config["data"].get("corpus") or {})

    @property
    def unit(self) -> str:
        return self.corpus().unit

    def split(self, split: str = "valid") -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(tokens, side arrays {loss_mask, distance} if any) of one split."""
        corpus = self.corpus()
        return corpus.split(split), corpus.side.get(split, {})


_CORPORA: dict[str, Any] = {}
_DEVICE = {"device": "cpu"}


def set_device(device: str | None) -> str:
    """Where the analyses run the models: "cpu", "cuda", or "auto" (a GPU if there is one)."""
    import torch

    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _DEVICE["device"] = str(device)
    return _DEVICE["device"]


def analysis_device() -> str:
    return _DEVICE["device"]


def load_corpus_cached(name: str, root: str | None, options: dict[str, Any]):
    from posenc_lab.data import load_corpus

    key = json.dumps([name, root, options], sort_keys=True)
    if key not in _CORPORA:
        _CORPORA[key] = load_corpus(name, root=root, **options)
    return _CORPORA[key]


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and ((path / "checkpoints").is_dir() or (path / "results.json").is_file())


def load_run(path: str | Path, need_checkpoint: bool = True) -> Run:
    path = Path(path)
    cfg_path = path / "config.yaml"
    if not cfg_path.is_file():
        raise RunError(f"{path} is not a posenc-lab run directory: no config.yaml (expected what "
                       f"`posenc-lab train` writes: config.yaml, checkpoints/last.ckpt, results.json)")
    config = yaml.safe_load(cfg_path.read_text())
    for key in ("posenc", "model", "data"):
        if not isinstance(config.get(key), dict):
            raise RunError(f"run {path}: config.yaml has no '{key}' section; is it a posenc-lab training run?")
    results = json.loads((path / "results.json").read_text()) if (path / "results.json").is_file() else None
    run = Run(path, config, results)
    if need_checkpoint:
        run.checkpoint  # noqa: B018 - raises RunError naming the run if it is missing
    return run


def find_runs(paths: Iterable[str | Path], need_checkpoint: bool = True) -> list[Run]:
    """Runs in ``paths``: each a run directory or a folder searched recursively (a Hydra multirun
    tree, an ablation folder). Hidden folders (``.hydra``) are skipped. Sorted in table order."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RunError(f"{p}: no such directory")
        if _is_run_dir(p) or (p / "config.yaml").is_file():
            found.append(p)
            continue
        for cfg in sorted(p.rglob("config.yaml")):
            d = cfg.parent
            if any(part.startswith(".") for part in d.relative_to(p).parts):
                continue
            if _is_run_dir(d):
                found.append(d)
    if not found:
        raise RunError(f"no posenc-lab runs (folders with config.yaml and checkpoints/) under "
                       f"{', '.join(map(str, paths))}")
    runs = [load_run(d, need_checkpoint) for d in dict.fromkeys(found)]
    return sort_runs(runs)


def sort_runs(runs: list[Run]) -> list[Run]:
    def order(r: Run):
        s = SCHEME_ORDER.index(r.scheme) if r.scheme in SCHEME_ORDER else len(SCHEME_ORDER)
        return (r.corpus_name, s, r.scheme, not r.recurrence, -r.loss_frac, r.mem_len, r.name)

    return sorted(runs, key=order)


def one_corpus(runs: list[Run], what: str) -> str:
    """The corpus shared by all runs, or a RunError listing which run uses which."""
    keys = {r.corpus_key for r in runs}
    if len(keys) > 1:
        listed = "; ".join(f"{r.name}: {r.corpus_key}" for r in runs)
        raise RunError(f"{what} compares runs of one corpus only, got {len(keys)} different corpora "
                       f"(run: corpus and options): {listed}. Analyse each corpus separately.")
    return runs[0].corpus_name


def metric_of(unit: str) -> tuple[str, float]:
    """(name, nats -> metric scale) of the loss figure: bits per byte/char, or nats per word (ppl = exp)."""
    if unit == "byte":
        return "bits per byte", 1 / math.log(2)
    if unit == "char":
        return "bits per character", 1 / math.log(2)
    return "nats per word", 1.0


def to_figure(loss_nats: float, unit: str) -> float:
    """The headline figure of a mean loss: bits per byte/char, perplexity for words."""
    if loss_nats is None or not np.isfinite(loss_nats):
        return float("nan")
    return loss_nats / math.log(2) if unit in ("byte", "char") else math.exp(loss_nats)


def figure_name(unit: str) -> str:
    return {"byte": "bpb", "char": "bpc"}.get(unit, "ppl")


def add_threads_argument(parser) -> None:
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: robust on a busy or shared CPU; 0: torch's default)")


def apply_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(int(threads))
