"""A run directory belongs to one run; this module names it (``named_run_dir``: the user's ``run_dir``, else the one
rule of folders no one named, ``run_folder``, which train, train -m, eval's mirrors, ablate and sweep share) and
keeps it.

``run.json`` in a run directory records the run's identity: everything that decides the
trajectory of the weights or the meaning of its figures,

    seed, posenc (scheme and options), model, data (every setting but where the cache lives and
    how many loader workers read it), the corpus (name, vocabulary and a SHA-256 of its token
    arrays), optim, and the trainer settings that change the updates (gradient clipping,
    accumulation, precision).

A later ``train`` into the same directory continues (or re-evaluates) that run only if its
identity is the same; anything else is refused, naming each difference. ``trainer.max_steps`` is
not part of it: a longer run may extend a finished one; nor is ``optim.total_steps``, the length of the
learning-rate schedule, which an extension may set anew (results.json records the schedule of every
stretch of steps). A folder that holds files but no
``run.json`` is not a run and is refused. A run directory whose run.json was deleted is
recognised by its checkpoint's config (its corpus is then taken as it is now).

``.lock`` keeps a second process out (``runlock.RunLock``).
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import logging
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .checkpoints import read_checkpoint
from .data import CORPORA, SPLITS, path_options
from .data.drawn import DrawnSide, DrawnSplit
from .errors import RunDirError
from .io import CorruptFileError, path_problem, read_json, write_json, write_text
from .model import ModelConfig
from .runlock import LOCK_FILE, RunLock, lock_not_a_file

log = logging.getLogger("posenc_lab.rundir")

# The corpus hash names the val split "valid", as it did before the split vocabulary was one: the
# identities of existing runs stay valid.
_HASHED_NAMES = {"val": "valid"}
_WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what wandb takes as a run id
FORMAT = 1

# data settings that say where the corpus lives or how it is read, not what it is
DATA_NOT_IDENTITY = ("root", "num_workers")
# model settings of speed only, the same math: a run may resume with another (positional/fused.py)
MODEL_NOT_IDENTITY = ("attention_impl",)
# optim settings a run may change when it is extended: the schedule's length (results.json records the schedule
# of every stretch of steps; optim.py)
OPTIM_NOT_IDENTITY = ("total_steps",)
# trainer settings that change the updates (devices may change: the global batch stays the same)
TRAINER_IDENTITY = ("gradient_clip_val", "gradient_clip_algorithm", "accumulate_grad_batches", "precision")


# ---- the one run-folder rule: train, train -m, eval's mirrors, ablate and sweep ------------------------------

RUNS = "runs"  # run folders no one named: <out>/runs/<name>/


def run_folder(out: str | Path, name: str) -> Path:
    """The run folder of trial ``name`` of the grid in ``out``: ``<out>/runs/<name>/``, the one rule of run folders
    that no one named. ``posenc-lab ablate``: out ``ablate.out``, name the cell and seed; ``posenc-lab sweep``: out
    ``--out``, name the trial id (unless the sweep file names a folder); ``posenc-lab train`` with no ``run_dir``:
    out the working directory, name ``run_name`` (conf/train.yaml's ``hydra.run.dir`` writes this rule for Hydra),
    and each job of ``train -m`` with none the same (``hydra.sweep.dir``/``subdir``); ``posenc-lab eval
    out_dir=DIR``: the run's mirror in DIR (``evaluate.output_dir``). A folder the user names (``run_dir=``,
    ``hydra.run.dir=``, ``hydra.sweep.dir=``, a sweep file's) is used as named."""
    return Path(out).resolve() / RUNS / name


def run_name(posenc: str, data: str, when: datetime.datetime, job: int | None = None) -> str:
    """The name of a `posenc-lab train` run started at ``when`` that no one named: ``<date>/<time>_<scheme>_<data>``;
    job ``job`` of a multirun (``train -m``): ``multirun/<date>/<time>/<job>_<scheme>_<data>``."""
    day, clock = when.strftime("%Y-%m-%d"), when.strftime("%H-%M-%S")
    if job is None:
        return f"{day}/{clock}_{posenc}_{data}"
    return f"multirun/{day}/{clock}/{job}_{posenc}_{data}"


def in_multirun() -> bool:
    """Whether this process runs a job of `posenc-lab train -m` (Hydra's multirun)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def named_run_dir(cfg: DictConfig) -> Path:
    """The run folder of `posenc-lab train` with ``cfg``: run_dir; unset: Hydra's output directory (without Hydra:
    the same rule's, ``run_folder(".", run_name(...))``). In a multirun always the job's own output directory (under
    run_dir when set, see hydra.sweep in train.yaml). ``train`` names it once, first, and writes it into
    ``cfg.run_dir``, so every later call returns the same folder. RunDirError if it cannot be a folder (a file, a
    dangling link, a name too long)."""
    if in_multirun():
        return Path(HydraConfig.get().runtime.output_dir).resolve()
    run_dir = OmegaConf.select(cfg, "run_dir", throw_on_missing=False)
    if run_dir is None:
        run_dir = (
            HydraConfig.get().runtime.output_dir
            if HydraConfig.initialized()
            else run_folder(".", run_name(cfg.posenc.name, cfg.data.name, datetime.datetime.now()))
        )
    problem = path_problem(run_dir, "run_dir")
    if problem:  # before resolve(), which fails on a loop of links
        raise RunDirError(problem)
    return Path(run_dir).resolve()


def corpus_identity(corpus) -> dict[str, Any]:
    """{name, unit, vocab_size, n_tokens per split, sha256 of every token (and side) array; of a split drawn on the
    fly, of what decides its draws (``DrawnSplit.identity``)}."""
    digest = hashlib.sha256()
    arrays = {_HASHED_NAMES.get(s, s): corpus.split(s) for s in SPLITS}
    for s, side in sorted(corpus.side.items()):
        for k, a in sorted(side.items()):  # a mapping of arrays (the position ids by kind): each array by its name
            named = sorted(a.items()) if isinstance(a, dict) else [(None, a)]
            arrays.update({".".join(filter(None, [_HASHED_NAMES.get(s, s), k, kind])): v for kind, v in named})
    for name, array in arrays.items():
        if isinstance(array, DrawnSplit | DrawnSide):  # drawn on the fly: what decides its draws stands for it
            drawn = array if isinstance(array, DrawnSplit) else array.split
            digest.update(f"{name}:drawn:{drawn.digest()}".encode())
            continue
        array = np.ascontiguousarray(array)
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        for start in range(0, array.size, 1 << 24):  # 16M items at a time: a memmap is never copied whole
            digest.update(memoryview(array[start : start + (1 << 24)]).cast("B"))
    return {
        "name": corpus.name,
        "unit": corpus.unit,
        "vocab_size": int(corpus.vocab_size),
        "n_tokens": {_HASHED_NAMES.get(s, s): int(len(corpus.split(s))) for s in SPLITS},
        "sha256": digest.hexdigest(),
    }


def absolute_paths(data: Any) -> Any:
    """A data section (a plain dict) with its corpus's local paths (``data.path_options``: textdir's and textfile's
    path) absolute, a relative one taken from the current folder. train stores them so in run.json, config.yaml
    and the checkpoint: eval and compare find the corpus from any folder. A relative path in an older run.json
    compares, from the folder it was typed in, as the same folder."""
    if not isinstance(data, dict) or data.get("name") not in CORPORA or not isinstance(data.get("corpus"), dict):
        return data
    corpus = dict(data["corpus"])
    for key in path_options(data["name"]):
        if isinstance(corpus.get(key), str):
            corpus[key] = os.path.abspath(os.path.expanduser(corpus[key]))
    return {**data, "corpus": corpus}


def run_identity(config: dict[str, Any], corpus: dict[str, Any] | None) -> dict[str, Any]:
    """The identity of a run from its resolved config (a plain dict) and corpus identity (the corpus's local
    paths absolute: ``absolute_paths``)."""
    trainer = config.get("trainer") or {}
    data = absolute_paths(config.get("data") or {})
    return {
        "seed": config.get("seed"),
        "posenc": config.get("posenc"),
        "model": _without(config.get("model"), MODEL_NOT_IDENTITY),
        "data": {k: v for k, v in data.items() if k not in DATA_NOT_IDENTITY},
        "corpus": corpus,
        "optim": _without(config.get("optim"), OPTIM_NOT_IDENTITY),
        "trainer": {k: trainer.get(k) for k in TRAINER_IDENTITY},
    }


def _with_absolute_paths(identity: Any) -> Any:
    """A saved identity with its data section's paths absolute (``absolute_paths``: an older run.json's relative
    path compares as the folder it names from here)."""
    if isinstance(identity, dict) and isinstance(identity.get("data"), dict):
        return {**identity, "data": absolute_paths(identity["data"])}
    return identity


def _without(section: Any, keys: tuple[str, ...]) -> Any:
    return {k: v for k, v in section.items() if k not in keys} if isinstance(section, dict) else section


_NO_DEFAULT = object()


def option_default(key: str, identity: dict[str, Any]) -> Any:
    """The default of a model option (``model.<field>``: ModelConfig's) or of the run's corpus's option
    (``data.corpus.<option>``: its loader's), the value a run had before the option existed; else none."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "model":
        found = {f.name: f.default for f in fields(ModelConfig) if f.default is not MISSING}
        return found.get(parts[1], _NO_DEFAULT)
    name = (identity.get("data") or {}).get("name")
    if len(parts) == 3 and parts[:2] == ["data", "corpus"] and name in CORPORA:
        parameter = inspect.signature(CORPORA[name]).parameters.get(parts[2])
        return _NO_DEFAULT if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default
    return _NO_DEFAULT


def differences(saved: Any, now: Any, key: str = "", default=None) -> list[str]:
    """``["optim.lr: run 0.001, now 0.01", ...]`` for every leaf that differs. ``default(key)``: the value an option
    had before it existed (``option_default``): a key one side lacks is no difference where the other side holds
    that value, so a run saved before an option was added stays the same run."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for k in list(saved) + [k for k in now if k not in saved]:
            path = f"{key}.{k}" if key else str(k)
            if (k in saved) != (k in now) and default is not None:
                present = saved[k] if k in saved else now[k]
                if (before := default(path)) is not _NO_DEFAULT and present == before:
                    continue
            out += differences(saved.get(k), now.get(k), path, default)
        return out
    if isinstance(saved, (list, tuple)) and isinstance(now, (list, tuple)):
        saved, now = list(saved), list(now)
    return [] if saved == now else [f"{key}: run {saved!r}, now {now!r}"]


@dataclass
class Results:
    """``results.json``: what a finished run reports (train.py fills it; the analyses read it).

    ``val`` and ``test`` hold ``{loss, <figure>, tokens}`` (loss in nats per scored token; the figure is
    ``metrics.figure_name`` of the corpus unit: bpb, bpc or ppl) plus, on recall, ``{acc, answers,
    acc_by_distance: {"1-7": ..., "8-15": ...}}``; ``schedule``: the learning-rate schedule each stretch
    of steps was trained under (one entry per invocation that trained); ``health``: whether the final state is
    healthy by the rule of a good checkpoint, ``{ok, checkpoint, step, val_loss, train_loss, loss_limit, weights,
    good}`` (``checkpoints.Checkpointing.final_health``; None without checkpoints)."""

    scheme: str
    posenc: dict  # the scheme's options
    data: str  # the corpus
    unit: str  # byte | char | word
    metric: str  # the figure's name: bpb | bpc | ppl
    seed: int
    steps: int
    tokens: int  # training tokens, global
    wall_time_s: float  # fit seconds of every invocation that led to the final weights
    params: int
    segment_len: int
    batch_size: int
    episode_len: int | None
    mem_len: int
    n_layer: int
    d_model: int
    n_head: int
    world_size: int
    run_dir: str
    checkpoint: str | None  # checkpoints/last.ckpt
    resumed_from: str | None
    val: dict | None = None
    test: dict | None = None
    schedule: list = field(default_factory=list)
    health: dict | None = None


class RunDir:
    """A run directory: the one place that names its files, and what they say (identity, "finished",
    results). ``RunDir(path).finished`` is what train, ablate and the analyses mean by a finished run."""

    RECORD = "run.json"
    CONFIG = "config.yaml"
    RESULTS = "results.json"
    LOCK = LOCK_FILE
    METRICS = "metrics.csv"
    CHECKPOINTS = "checkpoints"
    LAST = "last.ckpt"
    EVAL = "eval"
    HYDRA = ".hydra"
    WANDB_ID = "wandb_id"  # the run's wandb run id (tracking.py): a resumed run continues its wandb run

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @classmethod
    def of_checkpoint(cls, ckpt: str | os.PathLike) -> RunDir:
        """The run directory a checkpoint belongs to: the folder of its checkpoints/ folder (else its own)."""
        folder = Path(os.path.abspath(ckpt)).parent
        return cls(folder.parent if folder.name == cls.CHECKPOINTS else folder)

    # ---- its files ----
    @property
    def record_file(self) -> Path:
        return self.path / self.RECORD

    @property
    def config_file(self) -> Path:
        return self.path / self.CONFIG

    @property
    def results_file(self) -> Path:
        return self.path / self.RESULTS

    @property
    def metrics_file(self) -> Path:
        return self.path / self.METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / self.LAST

    @property
    def eval_dir(self) -> Path:
        return self.path / self.EVAL

    @property
    def hydra_dir(self) -> Path:
        return self.path / self.HYDRA

    @property
    def wandb_id_file(self) -> Path:
        return self.path / self.WANDB_ID

    # ---- what they say ----
    def is_run(self) -> bool:
        """A run directory as the analyses find them: its config and checkpoints (or results)."""
        return self.config_file.is_file() and (self.checkpoints.is_dir() or self.results_file.is_file())

    @property
    def finished(self) -> bool:
        """Trained to its end: results.json and the final checkpoint are there."""
        return self.results_file.is_file() and self.last_checkpoint.is_file()

    def newest_checkpoint(self) -> Path | None:
        """checkpoints/last.ckpt, else the newest other checkpoint there (periodic, good.ckpt), else None. A
        last-v<N>.ckpt newer than last.ckpt (older versions saved there after a change of checkpoint_every,
        leaving last.ckpt behind) is taken instead: the newest state."""
        if self.last_checkpoint.is_file():
            versions = [p for p in self.checkpoints.glob("last-v*.ckpt") if p.is_file()]
            return max([self.last_checkpoint, *versions], key=lambda p: p.stat().st_mtime_ns)
        others = [p for p in self.checkpoints.glob("*.ckpt") if not p.name.startswith(".") and p.is_file()]
        return max(others, key=lambda p: p.stat().st_mtime) if others else None

    def results(self) -> dict[str, Any] | None:
        """results.json as a dict (None before the run finished); CorruptFileError naming it if unreadable."""
        if not self.results_file.is_file():
            return None
        results = read_json(
            self.results_file,
            remedy=f"delete it (and {self.checkpoints} if the run should train again) and rerun: the run resumes "
            f"from its last checkpoint and rewrites it",
        )
        if not isinstance(results, dict):
            raise CorruptFileError(f"{self.results_file} is not a results record; delete it and rerun the run")
        return results

    def config(self) -> dict[str, Any]:
        """config.yaml (the resolved config of the run); CorruptFileError naming it if unreadable."""
        try:
            config = yaml.safe_load(self.config_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunDirError(f"{self.path} is not a posenc-lab run directory: no {self.CONFIG}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise CorruptFileError(
                f"{self.config_file} is corrupt ({type(e).__name__}); it is rewritten from the run's own config "
                f"when the run is trained again: rerun `posenc-lab train run_dir={self.path}` with its settings, or "
                f"delete the run directory"
            ) from e
        if not isinstance(config, dict) or not all(
            isinstance(config.get(k), dict) for k in ("posenc", "model", "data")
        ):
            raise CorruptFileError(
                f"{self.config_file} is not a posenc-lab run config (it needs posenc, model and data sections); "
                f"delete the run directory or train it again"
            )
        return config

    def composed_config(self) -> dict[str, Any] | None:
        """.hydra/config.yaml: the config as composed, its interpolations unresolved (``data.seed: ${seed}``);
        None without a readable one (a run trained from Python has none)."""
        try:
            config = yaml.safe_load((self.hydra_dir / self.CONFIG).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return None
        return config if isinstance(config, dict) else None

    def check_folders(self) -> None:
        """RunDirError naming the problem if this directory, its checkpoints/ or its .lock cannot be what they must
        (checked before anything is loaded or written)."""
        if problem := path_problem(self.path, "run_dir"):
            raise RunDirError(problem)
        if os.path.lexists(self.checkpoints) and not self.checkpoints.is_dir():
            raise RunDirError(
                f"run_dir {self.path}: its {self.CHECKPOINTS} is a file, not a folder (the run's checkpoints go "
                f"there); move it away or use another run_dir"
            )
        lock = self.path / self.LOCK
        if os.path.lexists(lock) and not lock.is_file():
            raise RunDirError(lock_not_a_file(lock))

    def write_results(self, results: Results) -> Path:
        return write_json(self.results_file, asdict(results))

    def check(self, identity: dict[str, Any], own_files: Iterable[str] = ()) -> dict[str, Any] | None:
        """The run record if this directory holds this run; None if it is missing or empty; else RunDirError.
        ``own_files``: names this very command may already have written there (its log), not counted as
        another's files."""
        run_dir = self.path
        problem = path_problem(run_dir, "run_dir")
        if problem:
            raise RunDirError(problem)
        if not run_dir.exists():
            return None
        if self.record_file.exists():
            record = read_json(
                self.record_file,
                remedy=f"delete it: {run_dir} is then recognised by its checkpoint "
                f"(without checkpoints, delete or move the whole folder)",
            )
            saved = record.get("identity") if isinstance(record, dict) else None
            if saved is None:
                raise RunDirError(f"{self.record_file} is not a posenc-lab run record; choose another run_dir")
            saved = _with_absolute_paths(saved)
        else:
            ckpt = self.newest_checkpoint()
            if ckpt is None:
                if others := self.foreign_files(own_files):
                    raise RunDirError(
                        f"run_dir {run_dir} holds files but is not a posenc-lab run (no {self.RECORD}): "
                        f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; choose a new or "
                        f"empty folder"
                    )
                return None
            # an older run: its identity from the checkpoint's config
            config = read_checkpoint(ckpt)["hyper_parameters"].get("config") or {}
            saved = run_identity(config, identity["corpus"])
            record = {"format": FORMAT, "identity": saved, "adopted_from": str(ckpt)}
        diff = differences(saved, identity, default=lambda key: option_default(key, identity))
        if diff:
            raise RunDirError(
                f"run_dir {run_dir} holds another run; it differs in {'; '.join(diff)}. Use another "
                f"run_dir (to start from one of its checkpoints with new settings: resume=PATH run_dir=NEW)"
            )
        return record

    def foreign_files(self, own_files: Iterable[str] = ()) -> list[str]:
        """The names in this folder that make it not a run, sorted: every file but its lock (and ``own_files``) when
        it holds neither run.json nor a checkpoint; [] for a run, a new or an empty folder. ``check`` refuses such
        a folder; a grid names them before it plans to train there (nothing is read but names)."""
        if not self.path.is_dir() or self.record_file.exists() or self.newest_checkpoint() is not None:
            return []
        return sorted(p.name for p in self.path.iterdir() if p.name not in {self.LOCK, *own_files})

    def write_record(self, identity: dict[str, Any], record: dict[str, Any] | None) -> None:
        """Write run.json for a new run (or one recognised by its checkpoint); keep an existing one."""
        if record is None or "adopted_from" in record:
            write_json(
                self.record_file,
                {
                    "format": FORMAT,
                    "identity": identity,
                    "created": datetime.datetime.now().isoformat(timespec="seconds"),
                    **({"adopted_from": record["adopted_from"]} if record else {}),
                },
            )

    def remove_new(self, before: Iterable[str], keep: Iterable[str] = ()) -> None:
        """Remove what this directory holds now but did not hold when it held ``before`` (names), but its lock and
        ``keep``: what a new run wrote before it failed at its start (never a file or folder that was there)."""
        for path in self.path.iterdir():
            if path.name in {*before, self.LOCK, *keep}:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def wandb_id(self) -> str | None:
        """The wandb run id this run logs to (None before it first started with logger=wandb)."""
        try:
            text = self.wandb_id_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            text = f"unreadable: {e}"
        if not _WANDB_ID.fullmatch(text):
            raise CorruptFileError(
                f"{self.wandb_id_file} holds no wandb run id ({text[:40]!r}); delete it: the run then logs to a new "
                f"wandb run"
            )
        return text

    def write_wandb_id(self, run_id: str) -> None:
        write_text(self.wandb_id_file, run_id + "\n")

    def identity(self) -> dict[str, Any] | None:
        """The identity recorded in run.json (None without one)."""
        if not self.record_file.is_file():
            return None
        record = read_json(self.record_file, remedy=f"delete it: {self.path} is then recognised by its checkpoint")
        return _with_absolute_paths(record.get("identity")) if isinstance(record, dict) else None

    def lock(self) -> RunLock:
        return RunLock(self.path)
