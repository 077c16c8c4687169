"""Checkpoints: read as data only, judged healthy or not, and the newest two good ones kept.

Checkpoints carry data, never code: they are read with torch.load(weights_only=True), whose unpickler
builds only tensors, dicts (also OrderedDict), lists, tuples, sets, numbers, strings and None. That is
all a posenc-lab checkpoint holds (Lightning's entries included; the hyper-parameters are plain
containers, see build.build_lit), so nothing more is allowed here. A file that needs any other global
(a class, a function) is refused before it is unpickled.

A checkpoint is called good only if (1) when saved, every weight, optimizer moment and memory state
was finite and no weight or memory value beyond SANE_*_ABS (trained weights are O(1), the residual
stream O(10-100); a diverging run reaches 1e6 and more), and (2) the training step right after it, from
exactly its weights and memory, gave a finite loss of at most SANE_LOSS_RATIO times the loss of a
uniform guess, ln(vocab_size) (a model far worse than guessing is broken). The final state, which no step
follows, is judged by the same rule at the end of training (``Checkpointing.final_health``): its val loss and the
last training step's stand in for the next step's.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import logging
import math
import os
import pickle
import re
import shutil
import signal
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import Tensor

from .distributed import stop_check_due
from .errors import STOP_SIGNALS, Interrupted, PosencLabError, signal_name
from .io import DiskFullError, atomic_path
from .pickles import code_in_pickle

log = logging.getLogger("posenc_lab.checkpoints")


class CheckpointError(PosencLabError, ValueError):
    """A checkpoint cannot be read or does not fit; the message names the file and what is wrong."""


class CheckpointUnreadable(CheckpointError):
    """The file is damaged (truncated, corrupted) or not a checkpoint at all."""


# Checkpoints carry data, never code: they are read with torch.load(weights_only=True), whose
# unpickler builds only tensors, dicts (also OrderedDict), lists, tuples, sets, numbers, strings
# and None. That is all a posenc-lab checkpoint holds (Lightning's entries included; the
# hyper-parameters are plain containers, see train.build_lit), so nothing more is allowed here.
# A file that needs any other global (a class, a function) is refused before it is unpickled.
CHECKPOINT_SAFE_GLOBALS: list = []

SANE_WEIGHT_ABS = 1e4
SANE_MEMORY_ABS = 1e6
SANE_LOSS_RATIO = 2.0


def sane_loss(loss: float | None, vocab_size: int) -> bool:
    """Rule (2) of a good checkpoint: a finite loss of at most SANE_LOSS_RATIO times ln(vocab_size)."""
    return loss is not None and math.isfinite(loss) and loss <= SANE_LOSS_RATIO * math.log(vocab_size)


def _refused(path: Path, detail: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is refused: it holds {detail}, which a posenc-lab checkpoint never does "
        f"(checkpoints carry tensors and plain data only). Nothing in it was run. Use a checkpoint written "
        f"by `posenc-lab train`."
    )


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a posenc-lab training checkpoint on the CPU, as data only, or raise CheckpointError
    naming the file (missing, unreadable, not a posenc-lab checkpoint, or needing code to load)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    if zipfile.is_zipfile(path):  # torch.save's format: list what it would import, without unpickling
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001 - any damage to the archive: torch.load below names the problem
            unsafe = []
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in CHECKPOINT_SAFE_GLOBALS}
        if set(unsafe) - allowed:
            raise _refused(path, f"code references ({', '.join(sorted(set(unsafe) - allowed))})")
    try:
        with torch.serialization.safe_globals(CHECKPOINT_SAFE_GLOBALS):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # the weights-only unpickler met something that is not plain data
        # torch names the global in one of two forms (the second for a module it blocks, e.g. posix.system)
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(e))
        code = f"a reference to the global {found.group(1)}" if found else None
        if code is None and not zipfile.is_zipfile(path):
            try:  # a plain pickle: find out, without running it, whether it references code or is damaged
                code = code_in_pickle(path)
            except ValueError:
                code = None
        if code:
            raise _refused(path, code) from None
        raise CheckpointUnreadable(
            f"checkpoint {path} cannot be read (corrupt or not a checkpoint): it is not the data a checkpoint holds"
        ) from None
    except Exception as e:
        raise CheckpointUnreadable(
            f"checkpoint {path} cannot be read (corrupt or not a checkpoint): {type(e).__name__}: {e}"
        ) from e
    missing = (
        [k for k in ("state_dict", "hyper_parameters", "posenc_lab") if k not in ckpt]
        if isinstance(ckpt, dict)
        else ["everything"]
    )
    if missing:
        raise CheckpointUnreadable(f"checkpoint {path} is not a posenc-lab training checkpoint (missing {missing})")
    return ckpt


def checkpoint_health(
    state_dict: dict[str, Tensor], mems: Sequence[Tensor], optimizer_states: Sequence[dict] = ()
) -> dict[str, Any]:
    """{"ok", "max_abs_weight", "max_abs_memory", "finite"}: ok iff all finite and within SANE_*_ABS."""

    def max_abs(tensors) -> float:
        values = [t.detach().abs().max().item() for t in tensors if t.is_floating_point() and t.numel()]
        return max(values, default=0.0)

    moments = [
        v for s in optimizer_states for p in s.get("state", {}).values() for v in p.values() if isinstance(v, Tensor)
    ]
    w, m, o = max_abs(state_dict.values()), max_abs(mems), max_abs(moments)
    finite = all(math.isfinite(x) for x in (w, m, o))
    return {
        "ok": finite and w <= SANE_WEIGHT_ABS and m <= SANE_MEMORY_ABS,
        "finite": finite,
        "max_abs_weight": w,
        "max_abs_memory": m,
    }


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every save is a new file: written beside its target, then renamed over it (io.atomic_path). Lightning's
    own writes to $TMPDIR and moves the file; across file systems (a tmpfs /tmp, a node-local $TMPDIR) that move
    copies *into* the existing last.ckpt, rewriting the inode good.ckpt and good.prev.ckpt are hard links to.
    A full disk raises io.DiskFullError naming the file, with the previous checkpoint intact. A checkpoint of an
    earlier version is read with its Checkpointing state under today's key (``Checkpointing.adopt_state``)."""

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        kwargs = {} if map_location is None else {"map_location": map_location}
        return Checkpointing.adopt_state(super().load_checkpoint(path, weights_only=weights_only, **kwargs))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        # a file object, not a name: torch then reports a full disk as the OSError it is, not a bare RuntimeError
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)


GOOD_CHECKPOINTS = ("good.ckpt", "good.prev.ckpt")  # the newest two good ones, newest first
_CANDIDATE = ".candidate.ckpt"  # the newest healthy checkpoint, until the next step confirms it


def _link(src: Path, dst: Path) -> None:
    """Atomically make ``dst`` a hard link to ``src`` (a copy where hard links do not exist)."""
    if dst.exists() and os.path.samefile(src, dst):
        return  # already; rename() of two links to one file does nothing and would leave tmp behind
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:  # a copy, written aside: a full disk leaves no half file
        with atomic_path(dst) as copy:
            shutil.copyfile(src, copy)
        return
    os.replace(tmp, dst)


class Checkpointing(ModelCheckpoint):
    """Lightning's ModelCheckpoint that also keeps the newest two good checkpoints (see SANE_*) as
    good.ckpt and good.prev.ckpt: hard links, so no copy while the file they were saved as lives
    (every save is a new file, AtomicCheckpointIO: a link keeps the weights it was made for). They are two files
    whatever the resumes: a candidate that already is one of them changes nothing.
    A divergence that spans several checkpoints still leaves a good one, whatever was overwritten.

    last.ckpt is one file, always the newest state: the callback's state is kept under a key that does not name
    the save interval (Lightning's does, so with another ``checkpoint_every`` it found no state, did not know
    last.ckpt as its own and, with its version counter, saved last-v1.ckpt beside it), and the version counter is
    off (a name this callback saves under is always its own to replace).

    A stop signal (``stop_signals``) during a training step ends training at the end of the step: last.ckpt is
    saved there, as a periodic checkpoint is (so it resumes exactly), the step's metrics are logged and flushed as
    for a last step (``trainer.should_stop``), and Interrupted is raised at the next hook, on every DDP rank at the
    same step. During a validation pass of training it ends the pass at the end of the validation batch: last.ckpt
    is saved as at the end of the training step before it (the fit loop's state of the pass's start: a resume
    trains on and does not repeat that validation, as after a checkpoint of Lightning's own at validation end).
    A second signal stops at once. These handlers replace Lightning's SIGTERM handling, whose SIGTERMException
    is a SystemExit that exits with status 0."""

    _candidate_step: int | None = None
    good: dict[str, Any] | None = None  # {step, loss}: good.ckpt's step and the loss of the step that confirmed it
    _last_loss: Tensor | None = None  # the last training step's loss (a tensor: no device sync per step)
    stop_signals: tuple[int, ...] = STOP_SIGNALS  # + the SLURM requeue signal under SLURM (train.py)
    _stop: int | None = None  # the stop signal received during training
    _stopping: Interrupted | None = None  # saved at the end of a step; raised at the next hook
    _loops_at_validation: dict[str, Any] | None = None  # the fit loop's state when a validation pass of fit began

    def __init__(self, *args: Any, enable_version_counter: bool = False, **kwargs: Any):
        super().__init__(*args, enable_version_counter=enable_version_counter, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "good": self.good}  # kept through resumes, for final_health

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:  # good.ckpt of another folder is not ours
            self.good = state_dict.get("good")

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    @classmethod
    def adopt_state(cls, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint`` with this callback's state, saved by an earlier version under Lightning's key (which also
        names every_n_train_steps, every_n_epochs, train_time_interval), moved to today's ``state_key``."""
        states = checkpoint.get("callbacks")
        prefix = cls.__qualname__
        for key in [k for k in states or {} if isinstance(k, str) and k.startswith(prefix + "{")]:
            try:
                fields = ast.literal_eval(key[len(prefix) :])
            except (ValueError, SyntaxError):
                continue
            if isinstance(fields, dict) and set(fields) > {"monitor", "mode"}:
                today = f"{prefix}{ {'monitor': fields['monitor'], 'mode': fields['mode']}!r}"
                states.setdefault(today, states.pop(key))
        return checkpoint

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        try:
            super()._save_checkpoint(trainer, filepath)
        except Exception as e:
            self._last_from_this_step(trainer, Path(filepath), e)
            raise
        health = getattr(trainer.lightning_module, "saved_health", None)
        if trainer.is_global_zero and health and health["ok"] and Path(filepath).is_file():
            _link(Path(filepath), Path(filepath).parent / _CANDIDATE)
            self._candidate_step = trainer.global_step

    def _last_from_this_step(self, trainer: L.Trainer, filepath: Path, error: Exception) -> None:
        """last.ckpt failed (a full disk) after this step's periodic checkpoint was saved (save_top_k=-1): that one
        becomes last.ckpt (a hard link: no space needed), the newest state, and the error says so."""
        saved, last = Path(self._last_checkpoint_saved or filepath), f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        this_step = self._last_global_step_saved == trainer.global_step and saved.is_file()
        if trainer.is_global_zero and filepath.name == last != saved.name and this_step:
            with contextlib.suppress(OSError):  # else the old last.ckpt, if any, is intact (every save is a new file)
                _link(saved, filepath)
                if isinstance(error, DiskFullError):
                    error.args = (f"{error}; {last} now names {saved}, saved at this step",)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._loops_at_validation is not None and "loops" in checkpoint:  # saved during a validation pass of fit
            checkpoint["loops"]["fit_loop"] = copy.deepcopy(self._loops_at_validation)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # after Lightning set its own handlers (it restores what was there before at the end of fit)
        self._stop, self._stopping, self._loops_at_validation = None, None, None
        if threading.current_thread() is threading.main_thread():
            for s in self.stop_signals:
                signal.signal(s, self._request_stop)
        # The checkpoint this fit resumed from is a candidate too (a new run directory may have no other).
        self._drop_candidate(trainer)  # one a killed process left
        health = getattr(pl_module, "loaded_health", None)
        if trainer.is_global_zero and trainer.ckpt_path and health and health["ok"]:
            Path(self.dirpath).mkdir(parents=True, exist_ok=True)
            _link(Path(trainer.ckpt_path), Path(self.dirpath) / _CANDIDATE)
            self._candidate_step = trainer.global_step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._raise_if_stopping(trainer)  # should_stop did not end training (min_steps not reached)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # trainer.global_step already counts this step's update: the loss came from step global_step - 1
        if self._candidate_step is not None and self._candidate_step == trainer.global_step - 1:
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float("nan")
            candidate = Path(self.dirpath) / _CANDIDATE
            if sane_loss(loss, pl_module.model.cfg.vocab_size) and candidate.is_file() and self._confirm(candidate):
                self.good = {"step": self._candidate_step, "loss": loss}
            self._candidate_step = None
        if isinstance(outputs, dict) and isinstance(outputs.get("loss"), Tensor):
            self._last_loss = outputs["loss"].detach()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._stop_if_asked(trainer, pl_module)

    @staticmethod
    def _confirm(candidate: Path) -> bool:
        """The candidate is good: good.ckpt, and the good.ckpt before it good.prev.ckpt; unless it already is one
        of them (a resume from a good last.ckpt): rotating it would leave one file under both names. True if it
        is good.ckpt now."""
        good, prev = (candidate.parent / name for name in GOOD_CHECKPOINTS)
        if any(p.exists() and os.path.samefile(candidate, p) for p in (good, prev)):
            is_good = good.exists() and os.path.samefile(candidate, good)
            candidate.unlink()
            return is_good
        if good.exists():
            os.replace(good, prev)
        os.replace(candidate, good)
        return True

    def final_health(self, trainer: L.Trainer, pl_module: L.LightningModule, val_loss: float | None) -> dict:
        """results.json's ``health``: is the final state (last.ckpt) healthy by the rule of a good checkpoint (the
        module doc)? ``weights``: ``checkpoint_health`` of its save; its losses: ``val_loss``, of exactly its weights,
        and ``train_loss``, the last training step's (from the weights just before it). ``ok`` is false if the
        weights are not, a loss is not finite, or every loss there is exceeds ``loss_limit`` (one alone may be a
        spike, or a val text unlike training's: recall's eval_max_distance). ``good``: good.ckpt's path, step and
        confirming loss (None without one)."""
        vocab = pl_module.model.cfg.vocab_size
        train_loss = None if self._last_loss is None else float(self._last_loss)
        losses = [x for x in (val_loss, train_loss) if x is not None]
        weights = getattr(pl_module, "saved_health", None)
        good = Path(self.dirpath) / GOOD_CHECKPOINTS[0]
        broken = not all(map(math.isfinite, losses)) or (losses and not any(sane_loss(x, vocab) for x in losses))
        return {
            "ok": bool((weights or {}).get("ok", True)) and not broken,
            "checkpoint": str(Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"),
            "step": trainer.global_step,
            "val_loss": val_loss,
            "train_loss": train_loss,
            "loss_limit": SANE_LOSS_RATIO * math.log(vocab),
            "weights": weights,
            "good": {"checkpoint": str(good), **(self.good or {})} if good.is_file() else None,
        }

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping(trainer)  # before the validation Lightning runs when training should stop
        super().on_validation_start(trainer, pl_module)
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._loops_at_validation = copy.deepcopy(trainer.fit_loop.state_dict())

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        if self._loops_at_validation is not None:
            self._stop_if_asked(trainer, pl_module)
            self._raise_if_stopping(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._loops_at_validation = None  # Lightning's own save here carries the loops' state of now
        super().on_validation_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping(trainer)
        super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping(trainer)
        super().on_train_end(trainer, pl_module)
        self._drop_candidate(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._drop_candidate(trainer)
        launcher = trainer.strategy.launcher
        if isinstance(exception, Interrupted) and exception.saved is None and hasattr(launcher, "kill"):
            launcher.kill(exception.signum)  # stopped at once: so are the DDP ranks this process started

    def _drop_candidate(self, trainer: L.Trainer) -> None:
        """No step follows to confirm the candidate (training ended, or failed): it is no file of the run's. A
        resume makes the checkpoint it starts from the candidate again (``on_train_start``)."""
        if trainer.is_global_zero and self.dirpath:
            (Path(self.dirpath) / _CANDIDATE).unlink(missing_ok=True)
        self._candidate_step = None

    @property
    def stop_requested(self) -> bool:
        """A stop signal arrived in this process and this step will be the last (LitLM logs it)."""
        return self._stop is not None

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop is not None:
            raise Interrupted(signum, f"stopped by {signal_name(signum)} (sent twice) during a training step")
        self._stop = signum
        where = "validation batch" if self._loops_at_validation is not None else "training step"
        log.warning(
            "%s: stopping after this %s, with a checkpoint (send it again to stop at once)", signal_name(signum), where
        )

    def _stop_if_asked(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """If a stop was asked (on any DDP rank): save last.ckpt now, log this step as a last one, and raise at the
        next hook (``_raise_if_stopping``), once Lightning has logged the step."""
        signum = self._stop or 0
        if trainer.world_size > 1:  # every rank stops at the same step: a save gathers the memory of all ranks
            if self._loops_at_validation is None and not stop_check_due(trainer):  # no sync between logged steps
                return
            asked = torch.tensor(signum, device=pl_module.device)
            signum = int(trainer.strategy.reduce(asked, reduce_op="max"))
        if not signum or self._stopping is not None:
            return
        if self._last_global_step_saved != trainer.global_step:
            self._save_checkpoint(trainer, str(Path(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")))
        cut = ", before the validation of that step finished" if self._loops_at_validation is not None else ""
        self._stopping = Interrupted(
            signum,
            f"stopped by {signal_name(signum)} at step {trainer.global_step}; saved {self._last_checkpoint_saved}{cut}",
            saved=self._last_checkpoint_saved,
            quiet=not trainer.is_global_zero,
        )
        trainer.should_stop = True  # Lightning logs the metrics of a step that ends training, whatever the interval

    def _raise_if_stopping(self, trainer: L.Trainer) -> None:
        if self._stopping is None:
            return
        stop, self._stopping = self._stopping, None
        for logger in trainer.loggers:  # the stopping step's metrics reach metrics.csv before the exit line
            logger.save()
        raise stop


def good_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest good checkpoint kept in ``directory`` (``Checkpointing``), or None."""
    for name in GOOD_CHECKPOINTS:
        try:
            read_checkpoint(Path(directory) / name)
            return Path(directory) / name
        except CheckpointError:
            continue
    return None
