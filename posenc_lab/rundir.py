"""A run directory belongs to one run.

``run.json`` in a run directory records the run's identity: everything that decides the
trajectory of the weights or the meaning of its figures,

    seed, posenc (scheme and options), model, data (every setting but where the cache lives and
    how many loader workers read it), the corpus (name, vocabulary and a SHA-256 of its token
    arrays), optim, and the trainer settings that change the updates (gradient clipping,
    accumulation, precision).

A later ``train`` into the same directory continues (or re-evaluates) that run only if its
identity is the same; anything else is refused, naming each difference. ``trainer.max_steps`` is
not part of it: a longer run may extend a finished one. A folder that holds files but no
``run.json`` is not a run and is refused. A run directory from before run.json existed is
recognised by its checkpoint's config (its corpus is then taken as it is now).

``.lock`` holds the pid and host of the process writing the run, under an OS lock (flock) that
the kernel drops when the process dies: a second process is refused while the first runs, and a
lock file left by a killed process is taken over (with a warning naming the dead pid).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import logging
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PosencLabError
from .io import read_json, write_json

log = logging.getLogger("posenc_lab.rundir")

RUN_FILE = "run.json"
LOCK_FILE = ".lock"
FORMAT = 1

# data settings that say where the corpus lives or how it is read, not what it is
DATA_NOT_IDENTITY = ("root", "num_workers")
# model settings of speed only, the same math: a run may resume with another (positional/fused.py)
MODEL_NOT_IDENTITY = ("attention_impl",)
# trainer settings that change the updates (devices may change: the global batch stays the same)
TRAINER_IDENTITY = ("gradient_clip_val", "gradient_clip_algorithm", "accumulate_grad_batches", "precision")


class RunDirError(PosencLabError, ValueError):
    """The run directory cannot take this run; the message names the folder and the reason."""


def corpus_identity(corpus) -> dict[str, Any]:
    """{name, unit, vocab_size, n_tokens per split, sha256 of every token (and side) array}."""
    digest = hashlib.sha256()
    arrays = {s: corpus.split(s) for s in ("train", "valid", "test")}
    arrays.update({f"{s}.{k}": a for s, side in sorted(corpus.side.items()) for k, a in sorted(side.items())})
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        for start in range(0, array.size, 1 << 24):  # 16M items at a time: a memmap is never copied whole
            digest.update(memoryview(array[start : start + (1 << 24)]).cast("B"))
    return {
        "name": corpus.name,
        "unit": corpus.unit,
        "vocab_size": int(corpus.vocab_size),
        "n_tokens": {s: int(len(corpus.split(s))) for s in ("train", "valid", "test")},
        "sha256": digest.hexdigest(),
    }


def run_identity(config: dict[str, Any], corpus: dict[str, Any] | None) -> dict[str, Any]:
    """The identity of a run from its resolved config (a plain dict) and corpus identity."""
    trainer = config.get("trainer") or {}
    return {
        "seed": config.get("seed"),
        "posenc": config.get("posenc"),
        "model": _model_identity(config.get("model")),
        "data": {k: v for k, v in (config.get("data") or {}).items() if k not in DATA_NOT_IDENTITY},
        "corpus": corpus,
        "optim": config.get("optim"),
        "trainer": {k: trainer.get(k) for k in TRAINER_IDENTITY},
    }


def _model_identity(model: Any) -> Any:
    return {k: v for k, v in model.items() if k not in MODEL_NOT_IDENTITY} if isinstance(model, dict) else model


def differences(saved: Any, now: Any, key: str = "") -> list[str]:
    """``["optim.lr: run 0.001, now 0.01", ...]`` for every leaf that differs."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for k in list(saved) + [k for k in now if k not in saved]:
            out += differences(saved.get(k), now.get(k), f"{key}.{k}" if key else str(k))
        return out
    if isinstance(saved, (list, tuple)) and isinstance(now, (list, tuple)):
        saved, now = list(saved), list(now)
    return [] if saved == now else [f"{key}: run {saved!r}, now {now!r}"]


def newest_checkpoint(run_dir: Path) -> Path | None:
    """checkpoints/last.ckpt, else the newest other checkpoint there (periodic, good.ckpt), else None."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if (ckpt_dir / "last.ckpt").is_file():
        return ckpt_dir / "last.ckpt"
    others = [p for p in ckpt_dir.glob("*.ckpt") if not p.name.startswith(".") and p.is_file()]
    return max(others, key=lambda p: p.stat().st_mtime) if others else None


def check_run_dir(run_dir: Path, identity: dict[str, Any], own_files: Iterable[str] = ()) -> dict[str, Any] | None:
    """The run record if ``run_dir`` holds this run; None if it is missing or empty; else RunDirError.
    ``own_files``: names this very command may already have written there (its log), not counted as
    another's files."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} is a file, not a folder")
    record_path = run_dir / RUN_FILE
    if record_path.exists():
        record = read_json(
            record_path,
            remedy=f"delete it: {run_dir} is then recognised by its checkpoint "
            f"(without checkpoints, delete or move the whole folder)",
        )
        saved = record.get("identity") if isinstance(record, dict) else None
        if saved is None:
            raise RunDirError(f"{record_path} is not a posenc-lab run record; choose another run_dir")
    else:
        ckpt = newest_checkpoint(run_dir)
        if ckpt is None:
            others = sorted(p.name for p in run_dir.iterdir() if p.name not in {LOCK_FILE, *own_files})
            if others:
                raise RunDirError(
                    f"run_dir {run_dir} holds files but is not a posenc-lab run (no {RUN_FILE}): "
                    f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; choose a new or "
                    f"empty folder"
                )
            return None
        from .lit import read_checkpoint  # an older run: its identity from the checkpoint's config

        config = read_checkpoint(ckpt)["hyper_parameters"].get("config") or {}
        saved = run_identity(config, identity["corpus"])
        record = {"format": FORMAT, "identity": saved, "adopted_from": str(ckpt)}
    if isinstance(saved, dict):  # a record written before MODEL_NOT_IDENTITY held a key
        saved = {**saved, "model": _model_identity(saved.get("model"))}
    diff = differences(saved, identity)
    if diff:
        raise RunDirError(
            f"run_dir {run_dir} holds another run; it differs in {'; '.join(diff)}. Use another "
            f"run_dir (to start from one of its checkpoints with new settings: resume=PATH run_dir=NEW)"
        )
    return record


def write_record(run_dir: Path, identity: dict[str, Any], record: dict[str, Any] | None) -> None:
    """Write run.json for a new run (or one recognised by its checkpoint); keep an existing one."""
    if record is None or "adopted_from" in record:
        write_json(
            Path(run_dir) / RUN_FILE,
            {
                "format": FORMAT,
                "identity": identity,
                "created": datetime.datetime.now().isoformat(timespec="seconds"),
                **({"adopted_from": record["adopted_from"]} if record else {}),
            },
        )


class RunLock:
    """``with RunLock(run_dir):`` -- this process alone writes the run (see the module docstring)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunDirError(
                        f"run_dir {self.path.parent} is being written by another process ({holder}); "
                        f"wait for it to finish or use another run_dir"
                    ) from None
                raise RunDirError(
                    f"cannot lock {self.path} ({e}); this file system does not support file "
                    f"locks: put run_dir on a local or lockable file system"
                ) from e
            try:  # the holder may have removed the file between our open and flock: lock the new one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous:
            log.warning(
                "run_dir %s: taking over the lock left by a process that no longer runs (%s)",
                self.path.parent,
                previous,
            )
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"pid {os.getpid()} on {socket.gethostname()} since "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(),
            0,
        )
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
