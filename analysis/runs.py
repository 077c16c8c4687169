"""Run directories as the analysis sees them: discovery (single runs, Hydra multirun trees,
ablation folders), their settings, their trained model and their evaluation data.

A run directory is what ``posenc-lab train`` writes: ``config.yaml`` (the resolved config),
``checkpoints/last.ckpt``, ``results.json`` (when finished). Everything here goes through
posenc_lab's public API (``posenc_lab.evaluate.load_model``, ``posenc_lab.data.load_corpus``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

KIND_ORDER = ("absolute", "relative", "none")


def scheme_rank(scheme: str) -> tuple:
    """Row order of every table: by kind (absolute, relative, none: the registry's class attribute),
    then by name; a scheme the registry does not know goes last."""
    from posenc_lab.positional import SCHEMES

    cls = SCHEMES.get(scheme)
    kind = getattr(cls, "kind", None)
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), scheme)


def scheme_order() -> list[str]:
    """Every registered scheme in table order."""
    from posenc_lab.positional import SCHEME_NAMES

    return sorted(SCHEME_NAMES, key=scheme_rank)


def cell_name(scheme: str, mem_len: int, loss: str) -> str:
    """The name of a cell of the grid (the runs equal but for their seed)."""
    return f"{scheme}, mem {mem_len}, {loss} loss"


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
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return None if seed is None else int(seed)

    @property
    def label(self) -> str:
        """e.g. 'xl, mem 64, full loss, seed 0' (unique within an ablation)."""
        return f"{self.scheme}, mem {self.mem_len}, {self.loss} loss" + (
            "" if self.seed is None else f", seed {self.seed}"
        )

    @property
    def cell(self) -> str:
        """The runs that differ only in ``seed`` share a cell: e.g. 'xl, mem 64, full loss'."""
        return cell_name(self.scheme, self.mem_len, self.loss)

    @property
    def key(self) -> dict[str, Any]:
        """The columns that identify the run in every table."""
        return {
            "run": self.name,
            "scheme": self.scheme,
            "recurrence": "on" if self.recurrence else "off",
            "mem_len": self.mem_len,
            "loss": self.loss,
        }

    @property
    def checkpoint(self) -> Path:
        ckpt = self.path / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise RunError(
                f"run {self.path}: no checkpoint at {ckpt} (the run did not finish or its checkpoints "
                f"were removed); train it again (posenc-lab train run_dir={self.path} resumes) or leave "
                f"it out"
            )
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
        return load_corpus_cached(
            self.corpus_name, self.config["data"].get("root"), self.config["data"].get("corpus") or {}
        )

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
        raise RunError(
            f"{path} is not a posenc-lab run directory: no config.yaml (expected what "
            f"`posenc-lab train` writes: config.yaml, checkpoints/last.ckpt, results.json)"
        )
    config = yaml.safe_load(cfg_path.read_text())
    for key in ("posenc", "model", "data"):
        if not isinstance(config.get(key), dict):
            raise RunError(f"run {path}: config.yaml has no '{key}' section; is it a posenc-lab training run?")
    results = None
    if (path / "results.json").is_file():
        from posenc_lab.io import CorruptFileError, read_json

        try:
            results = read_json(
                path / "results.json",
                remedy=(
                    f"delete it (and {path / 'checkpoints'} if the run should train again) and rerun: "
                    f"the run resumes from its last checkpoint and rewrites it"
                ),
            )
        except CorruptFileError as e:
            raise RunError(str(e)) from e
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
        raise RunError(
            f"no posenc-lab runs (folders with config.yaml and checkpoints/) under {', '.join(map(str, paths))}"
        )
    runs = [load_run(d, need_checkpoint) for d in dict.fromkeys(found)]
    return sort_runs(runs)


def sort_runs(runs: list[Run]) -> list[Run]:
    def order(r: Run):
        return (
            r.corpus_name,
            scheme_rank(r.scheme),
            not r.recurrence,
            -r.loss_frac,
            r.mem_len,
            -1 if r.seed is None else r.seed,
            r.name,
        )

    return sorted(runs, key=order)


def cells(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs grouped by cell (equal but for the seed), in table order; refuses two runs of one
    cell with the same seed (the same experiment twice: which one would count?)."""
    several = len({r.corpus_key for r in runs}) > 1
    out: dict[str, list[Run]] = {}
    for r in sort_runs(runs):  # several corpora: the cell's name starts with its corpus
        out.setdefault(f"{r.corpus_name}: {r.cell}" if several else r.cell, []).append(r)
    for cell, group in out.items():
        seeds = [r.seed for r in group]
        if len(set(seeds)) < len(seeds):
            raise RunError(
                f"cell {cell!r} holds runs with the same seed: "
                + ", ".join(f"{r.path} (seed {r.seed})" for r in group)
                + "; analyse one of each (remove or move the duplicate)"
            )
    return out


def one_corpus(runs: list[Run], what: str) -> str:
    """The corpus shared by all runs, or a RunError listing which run uses which."""
    keys = {r.corpus_key for r in runs}
    if len(keys) > 1:
        listed = "; ".join(f"{r.name}: {r.corpus_key}" for r in runs)
        raise RunError(
            f"{what} compares runs of one corpus only, got {len(keys)} different corpora "
            f"(run: corpus and options): {listed}. Analyse each corpus separately."
        )
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
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: robust on a busy or shared CPU; 0: torch's default)",
    )


def apply_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(int(threads))
