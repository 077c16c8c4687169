"""AdamW and its learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio`` (per step).

Weight decay applies to the matrices of linear maps only: not to embeddings (tied with the output
head), positional tables and vectors, norms or biases. The settings are conf/train.yaml's ``optim``.

The schedule (``schedule``) is fixed when a run starts: its length is optim.total_steps, else the first
trainer.max_steps. A run extended with a longer trainer.max_steps keeps it, and says so: the new steps
train at the floor, lr x min_lr_ratio. Stretching the cosine instead would change the learning rate of
steps already taken into a jump back up, silently. A new cosine is asked for with optim.total_steps.
Checkpoints and results.json record the schedule of every stretch of steps (``stretches``).
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import lightning as L
import torch
from torch import nn

log = logging.getLogger("posenc_lab.optim")


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1 over ``warmup_steps``, then cosine decay to ``min_lr_ratio``
    at ``total_steps`` (and flat after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule(optim: dict[str, Any], trainer: L.Trainer | None, trained_under: dict | None = None) -> dict[str, Any]:
    """{lr, warmup_steps, total_steps, min_lr_ratio} to train under. total_steps, the step at which the cosine
    reaches its floor: optim.total_steps, else that of the schedule the checkpoint was trained under
    (``trained_under``, when resuming), else trainer.max_steps."""
    max_steps = trainer.max_steps if trainer is not None else None
    total = optim.get("total_steps") or (trained_under or {}).get("total_steps") or max_steps
    if total is None or total < 1:
        raise ValueError(
            "the learning-rate schedule needs the run length: set trainer.max_steps (or optim.total_steps)"
        )
    if not optim.get("total_steps") and trained_under and max_steps is not None and max_steps > total:
        log.warning(
            "trainer.max_steps=%d runs past the end of this run's learning-rate schedule, which is kept: the cosine "
            "reached its floor at step %d (optim.total_steps=null: the run's first trainer.max_steps), so steps "
            "%d-%d train at lr x min_lr_ratio = %.3g. For a new cosine to step %d instead: optim.total_steps=%d",
            max_steps, total, total, max_steps, float(optim["lr"]) * float(optim["min_lr_ratio"]), max_steps,
            max_steps,
        )  # fmt: skip
    return {
        "lr": float(optim["lr"]),
        "warmup_steps": int(optim["warmup_steps"]),
        "total_steps": int(total),
        "min_lr_ratio": float(optim["min_lr_ratio"]),
    }


def stretches(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The stretches of steps a training checkpoint was trained under, oldest first: [{from_step, to_step, lr,
    warmup_steps, total_steps, min_lr_ratio}]."""
    return [dict(s) for s in checkpoint["posenc_lab"]["schedule"]]


def adamw_kernel(trainer: L.Trainer | None) -> dict:
    """The fused AdamW (one kernel for all tensors, CPU and CUDA; the loop version costs a pass per tensor),
    except under mixed precision with gradient clipping: Lightning refuses to clip for an optimizer that
    unscales its own gradients, and the fused one declares that it does. There the multi-tensor (foreach)
    kernel serves."""
    mixed = trainer is not None and str(trainer.precision).endswith("-mixed")
    clipped = trainer is not None and bool(trainer.gradient_clip_val)
    return {"foreach": True} if mixed and clipped else {"fused": True}


def configure(model: nn.Module, optim: dict[str, Any], trainer: L.Trainer | None, plan: dict[str, Any]) -> dict:
    """Lightning's ``configure_optimizers`` answer: AdamW in two groups (decay, no decay) and the schedule
    ``plan`` (see ``schedule``)."""
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if id(p) in linear - embedding else no_decay).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(optim["weight_decay"])}, {"params": no_decay, "weight_decay": 0.0}],
        lr=float(optim["lr"]),
        betas=tuple(optim["betas"]),
        eps=float(optim["eps"]),
        **adamw_kernel(trainer),
    )
    factor = partial(
        warmup_cosine,
        warmup_steps=plan["warmup_steps"],
        total_steps=plan["total_steps"],
        min_lr_ratio=plan["min_lr_ratio"],
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def use_settings(checkpoint: dict[str, Any], optim: dict[str, Any], plan: dict[str, Any]) -> None:
    """Make a checkpoint's optimizer and scheduler states train with ``optim`` and the schedule ``plan``
    (resuming with other settings, e.g. a lower lr after a divergence): Lightning restores the saved lr,
    betas, ... after the load hook."""
    lr, factor = plan["lr"], 1.0
    for sched in checkpoint.get("lr_schedulers", []):
        factor = warmup_cosine(
            int(sched.get("last_epoch", 0)), plan["warmup_steps"], plan["total_steps"], plan["min_lr_ratio"]
        )
        sched["base_lrs"] = [lr] * len(sched.get("base_lrs", []))
        sched["_last_lr"] = [lr * factor] * len(sched.get("base_lrs", []))
    for state in checkpoint.get("optimizer_states", []):
        for i, group in enumerate(state.get("param_groups", [])):
            group.update(
                lr=lr * factor,
                initial_lr=lr,
                betas=tuple(optim["betas"]),
                eps=float(optim["eps"]),
                weight_decay=float(optim["weight_decay"]) if i == 0 else 0.0,
            )  # the two groups of configure()
