"""Run directories as the analysis sees them: discovery (single runs, Hydra multirun trees, ablation
folders), their settings, their cells, their trained model and their evaluation text.

A run directory is what ``posenc-lab train`` writes (``posenc_lab.rundir.RunDir`` names its files). A
*cell* is the runs equal but for their seed; ``Run.cell`` is its one name (``cellnames``: ``xl:mem32``,
``xl:nomem``, ``xl:mem32:half``, ``recall/xl:mem16``), in every table, in the report, in ``conf/paper.yaml``
and in ``ablate.extra_seed_cells``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc_lab.cellnames import WINDOW_KEY, HasCell, loss_label
from posenc_lab.data import load_corpus
from posenc_lab.data.lengthgen import TASKS
from posenc_lab.errors import PosencLabError
from posenc_lab.evaluate import load_model
from posenc_lab.io import CorruptFileError
from posenc_lab.positional import SCHEMES, scheme_names
from posenc_lab.rundir import RunDir, RunDirError

KIND_ORDER = ("absolute", "relative", "none")


def scheme_rank(scheme: str) -> tuple:
    """Row order of every table: by kind (absolute, relative, none: the registry's class attribute), then
    by name; a scheme the registry does not know goes last."""
    kind = getattr(SCHEMES.get(scheme), "kind", None)
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), scheme)


def scheme_order() -> list[str]:
    """Every registered scheme in table order."""
    return sorted(scheme_names(), key=scheme_rank)


class RunError(PosencLabError, ValueError):
    """A run directory cannot be analysed; the message names the directory and what is missing."""


@dataclass
class Run(HasCell):  # cell_name, cell, label: cellnames.HasCell (its group: "recall" for the probe)
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
        return loss_label(self.loss_frac)

    @property
    def corpus_name(self) -> str:
        return str(self.config["data"]["name"])

    @property
    def corpus_key(self) -> str:
        """The corpus and its preparation options: runs compare only when this is equal."""
        opts = self.config["data"].get("corpus") or {}
        return self.corpus_name + (json.dumps(opts, sort_keys=True) if opts else "")

    @property
    def group(self) -> str | None:
        """The corpus group of the cell name: None for the language corpus, 'recall' for the probe, the task's
        name for a length-generalization task (``posenc_lab.data.lengthgen``: its runs form no corpus group)."""
        if self.corpus_name == "recall":
            return "recall"
        return self.corpus_name if self.corpus_name in TASKS else None

    @property
    def segment_len(self) -> int:
        return int(self.config["data"]["segment_len"])

    @property
    def window(self) -> int:
        """W > 0 for a window cell (trained without memory at segment W beside a grid at L: ``WINDOW_KEY``)."""
        return self.segment_len if self.config.get(WINDOW_KEY) and not self.recurrence else 0

    @property
    def episode_len(self) -> int | None:
        T = self.config["data"].get("episode_len")
        return None if T is None else int(T)

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return None if seed is None else int(seed)

    @property
    def random_positions(self) -> int | None:
        """+model.random_positions=P (Ruoss et al. 2023): the cell <scheme>+rand<P>."""
        return self.config["model"].get("random_positions")

    @property
    def model_options(self) -> dict:
        """The model options, of which those that name a cell (``cellnames.MARKS``: <scheme>+ssmax, +sink, +gate)."""
        return dict(self.config["model"])

    @property
    def posenc(self) -> dict | None:
        """The run's posenc node: a hybrid's layers and DroPE's step name its cell (``cellnames.scheme_label``)."""
        return self.config.get("posenc")

    @property
    def train_attention_length(self) -> int:
        """What a training token saw at most: M with memory (the same-length window), L - 1 without."""
        return self.mem_len if self.recurrence else self.segment_len - 1

    @property
    def key(self) -> dict[str, Any]:
        """The columns that identify the run in every tidy table."""
        return {"run": self.name, "cell": self.cell, "scheme": self.scheme, "mem_len": self.mem_len, "loss": self.loss}

    @property
    def checkpoint(self) -> Path:
        ckpt = RunDir(self.path).last_checkpoint
        if not ckpt.is_file():
            raise RunError(
                f"run {self.path}: no checkpoint at {ckpt} (the run did not finish or its checkpoints were removed); "
                f"train it again (posenc-lab train run_dir={self.path} resumes) or leave it out"
            )
        return ckpt

    # ---- model and data -------------------------------------------------------------------
    def model(self):
        """The trained MemoryTransformer in eval mode (loaded once), on the analysis device."""
        if "model" not in self._cache:
            self._cache["model"] = load_model(self.checkpoint).eval().to(analysis_device())
        return self._cache["model"]

    def corpus(self):
        return load_corpus_cached(
            self.corpus_name, self.config["data"].get("root"), self.config["data"].get("corpus") or {}
        )

    @property
    def unit(self) -> str:
        return self.corpus().unit

    def split(self, split: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(tokens, side arrays {loss_mask, distance} if any) of one split."""
        corpus = self.corpus()
        return corpus.split(split), corpus.side.get(split, {})


_CORPORA: dict[str, Any] = {}
_DEVICE = {"device": "cpu"}


def set_device(device: str | None) -> str:
    """Where the analyses run the models: "cpu", "cuda", or "auto" (a GPU if there is one)."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _DEVICE["device"] = str(device)
    return _DEVICE["device"]


def analysis_device() -> str:
    return _DEVICE["device"]


def load_corpus_cached(name: str, root: str | None, options: dict[str, Any]):
    key = json.dumps([name, root, options], sort_keys=True)
    if key not in _CORPORA:
        _CORPORA[key] = load_corpus(name, root=root, **options)
    return _CORPORA[key]


def load_run(path: str | Path, need_checkpoint: bool = True) -> Run:
    """The run of a directory; RunError naming the file that is missing or cannot be read."""
    run_dir = RunDir(path)
    try:
        run = Run(run_dir.path, run_dir.config(), run_dir.results())
    except (RunDirError, CorruptFileError) as e:
        raise RunError(str(e)) from e
    if need_checkpoint:
        run.checkpoint  # noqa: B018 - raises RunError naming the run if it is missing
    return run


def find_runs(paths: Iterable[str | Path], need_checkpoint: bool = True) -> list[Run]:
    """Runs in ``paths``: each a run directory or a folder searched recursively (a Hydra multirun tree, an
    ablation folder). Hidden folders (``.hydra``) are skipped. Sorted in table order."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RunError(f"{p}: no such directory")
        if RunDir(p).config_file.is_file():
            found.append(p)
            continue
        for cfg in sorted(p.rglob(RunDir.CONFIG)):
            d = cfg.parent
            if not any(part.startswith(".") for part in d.relative_to(p).parts) and RunDir(d).is_run():
                found.append(d)
    if not found:
        raise RunError(
            f"no posenc-lab runs (folders with config.yaml and checkpoints/) under {', '.join(map(str, paths))}"
        )
    return sort_runs([load_run(d, need_checkpoint) for d in dict.fromkeys(found)])


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


def grid_segment(runs: list[Run]) -> int:
    """The segment length L of a group's grid: its runs' longest, window cells left out (a window cell trains at
    L + M to match the memory cells' span; the grid, its marks and the verdicts' lengths are the memory cells')."""
    return max((r.segment_len for r in runs if not r.window), default=max(r.segment_len for r in runs))


def cells(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs grouped by cell (equal but for the seed), in table order; refuses two runs of one cell with
    the same seed (the same experiment twice: which one would count?)."""
    several = len({r.corpus_key for r in runs if r.group is None}) > 1
    out: dict[str, list[Run]] = {}
    for r in sort_runs(runs):  # several language corpora: the cell's name starts with its corpus
        name = replace(r.cell_name, group=r.corpus_name) if several and r.group is None else r.cell_name
        out.setdefault(str(name), []).append(r)
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
            f"{what} compares runs of one corpus only, got {len(keys)} different corpora (run: corpus and options): "
            f"{listed}. Analyse each corpus separately."
        )
    return runs[0].corpus_name


def add_threads_argument(parser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: robust on a busy or shared CPU; 0: torch's default)",
    )


def apply_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(int(threads))
