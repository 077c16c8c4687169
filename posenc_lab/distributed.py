"""A distributed run that lost one of its processes: a collective failed because another node or device is gone.
Named in one line (train.py) instead of the backend's traceback, with the checkpoint to continue from."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import torch

from .errors import PosencLabError


class LostProcessError(PosencLabError, RuntimeError):
    """Another process of a distributed run (a node, a device) is gone; the message names the checkpoint to go on."""


# gloo raises plain RuntimeErrors; their words, and NCCL's, when a peer is gone or cannot be reached
_LOST_WORDS = re.compile(r"gloo|nccl|connection (reset|closed|refused)|broken pipe|timed out|socket", re.IGNORECASE)


def backend_words(error: BaseException | None) -> str | None:
    """The backend's own words if ``error`` (or one behind it) is a collective that failed because another process
    of the run is gone (torch.distributed's errors, gloo's RuntimeErrors); else None."""
    dist_error = getattr(torch.distributed, "DistError", ())
    while error is not None:
        if isinstance(error, PosencLabError):
            return None
        if isinstance(error, dist_error) or (isinstance(error, RuntimeError) and _LOST_WORDS.search(str(error))):
            words = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip().splitlines()[0])  # gloo's source location
            return words.split(". ")[0]
        error = error.__cause__ or error.__context__
    return None


def lost_process(error: BaseException, trainer: L.Trainer, newest: Path | None) -> LostProcessError | None:
    """The one-line error for ``error`` if a process of ``trainer``'s run was lost (``newest``: the checkpoint to
    continue from), else None."""
    words = backend_words(error)
    if words is None:
        return None
    return LostProcessError(
        f"process {trainer.global_rank} of {trainer.world_size} lost another process of this run at step "
        f"{trainer.global_step} (a node or a device stopped, or the network between them failed): {words}. "
        f"Newest checkpoint: {newest or 'none yet'}; start every node again with the same command to continue "
        f"from it (resume=auto)"
    )


def stop_check_due(trainer: L.Trainer) -> bool:
    """Whether the end of this training step asks every DDP rank for a stop signal (an all-reduce and a host read,
    which make the step wait for the device): only at the steps Lightning logs (every ``log_every_n_steps``, counted
    from ``trainer.global_step``, the same on every rank) and at ``max_steps``. Between them the step never waits for
    the host; a signal is acted on at most ``log_every_n_steps - 1`` steps after it arrived (one process acts at once).
    """
    step, every = trainer.global_step, max(int(trainer.log_every_n_steps or 1), 1)
    return step % every == 0 or 0 < trainer.max_steps <= step
