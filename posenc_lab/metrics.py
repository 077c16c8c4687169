"""What an evaluation pass measures, and what it can keep per token.

``EvalStats`` (a torchmetrics ``Metric``: its sums are added over DDP ranks when computed) gives

    loss = sum_t loss_t [t scored] / #scored            (nats per scored token)
    acc  = #(argmax = target, t answered) / #answered    (answered: scored tokens with a recall distance)
    acc_by_distance[bucket]: the same over the answers whose distance falls in the bucket.

``TokenDump`` is a Lightning callback that keeps every token of the val/test passes (``posenc-lab eval
dump_losses=true``): token_loss, targets, loss_mask, distance, correct (argmax == target) and position
(since the episode start), each [n_streams, T] in stream order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

from .data import EVAL_SPLITS, SPLITS
from .defaults import distance_buckets as default_buckets

TRAIN_EXTRAS = ("lr", "tokens_per_s", "tokens")  # logged by training only
#: the headline figure of a corpus unit: bits per byte, bits per character, perplexity of words
FIGURES = {"byte": "bpb", "char": "bpc", "word": "ppl"}


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """[1, 8, 16] -> ["1-7", "8-15", "16+"]."""
    return [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])] + [f"{edges[-1]}+"]


#: figure names that no longer exist -> what replaced them (a user who writes one is told the new name)
RENAMED_FIGURES = {"bpt": "the corpus's figure"}


def renamed_figure(metric: str, unit: str | None) -> str | None:
    """``val/bpt`` -> one line naming its new name for a corpus of ``unit`` (``val/bpb`` for bytes; all three where
    the unit is unknown); None for a name that was never renamed."""
    split, _, leaf = metric.rpartition("/")
    if leaf not in RENAMED_FIGURES:
        return None
    prefix = f"{split}/" if split else ""
    new = prefix + figure_name(unit) if unit in FIGURES else " or ".join(prefix + f for f in FIGURES.values())
    return (
        f"{metric} is no longer logged: its name is now {new} ({RENAMED_FIGURES[leaf]}: bpb for bytes, bpc for "
        f"characters, ppl for words)"
    )


def figure_name(unit: str) -> str:
    """The headline figure of a corpus of ``unit`` tokens (FIGURES): ``bpb``, ``bpc`` or ``ppl``."""
    if unit not in FIGURES:
        raise ValueError(f"unknown corpus unit {unit!r}; valid: {', '.join(FIGURES)}")
    return FIGURES[unit]


def figure(loss: Tensor | float, unit: str) -> Tensor:
    """nats per token -> the figure of ``figure_name(unit)``: exp(loss) for words, else loss / ln 2 (bits)."""
    loss = torch.as_tensor(loss)
    return loss.exp() if figure_name(unit) == "ppl" else loss / math.log(2)


SCALES = {"byte": ("bits per byte", 1 / math.log(2)), "char": ("bits per character", 1 / math.log(2))}


def figure_scale(unit: str) -> tuple[str, float]:
    """(what a loss difference is in, nats -> that unit): bits per byte or character, nats per word (a
    difference of log-perplexities: ppl itself is a ratio)."""
    figure_name(unit)  # an unknown unit is named there
    return SCALES.get(unit, ("nats per word", 1.0))


def logged_metrics(unit: str | None, answers: bool, distance_buckets: Sequence[int] | None = None) -> set[str]:
    """Every key LitLM logs for a corpus of ``unit`` tokens (None: unknown, both figures) whose batches carry
    recall distances if ``answers``: ``{train,val,test}/{loss,<figure>}``, ``train/{lr,tokens_per_s,tokens}``
    and, with answers, ``{train,val,test}/acc`` and ``{val,test}/acc_d<bucket>``."""
    figures = {"loss", figure_name(unit)} if unit else {"loss", *FIGURES.values()}
    distance_buckets = default_buckets() if distance_buckets is None else distance_buckets
    names = {f"{split}/{k}" for split in SPLITS for k in figures} | {f"train/{k}" for k in TRAIN_EXTRAS}
    if answers:
        names |= {f"{split}/acc" for split in SPLITS}
        names |= {f"{split}/acc_d{b}" for split in EVAL_SPLITS for b in bucket_labels(sorted(distance_buckets))}
    return names


class EvalStats(Metric):
    """Sums of one evaluation pass (see the module doc); ``compute()`` returns plain numbers."""

    full_state_update = False

    def __init__(self, distance_buckets: Sequence[int] | None = None):
        super().__init__()
        edges = sorted(int(e) for e in (default_buckets() if distance_buckets is None else distance_buckets))
        if not edges or edges[0] < 0:
            raise ValueError(f"distance_buckets must be non-empty lower edges >= 0, got {list(distance_buckets)}")
        self.bucket_names = bucket_labels(edges)
        self.register_buffer("edges", torch.tensor(edges), persistent=False)
        n = len(edges)
        self.add_state("loss_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("answered", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("correct", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, token_loss: Tensor, scored: Tensor, distance: Tensor, correct: Tensor | None) -> None:
        """token_loss: [B, L] nats; scored: [B, L] bool; distance: [B, L] (-1: no answer); correct: [B, L] bool
        (argmax == target), needed only where some scored token has a distance."""
        self.loss_sum += (token_loss.double() * scored).sum()
        self.tokens += scored.sum()
        answered = scored & (distance >= 0)
        if not answered.any():
            return
        n = len(self.bucket_names)
        bucket = (torch.bucketize(distance, self.edges, right=True) - 1).clamp(min=0)
        self.answered += torch.bincount(bucket[answered], minlength=n)[:n].double()
        self.correct += torch.bincount(bucket[answered & correct], minlength=n)[:n].double()

    def compute(self) -> dict[str, Any]:
        tokens = float(self.tokens)
        result: dict[str, Any] = {"loss": float(self.loss_sum) / max(tokens, 1.0), "tokens": int(tokens)}
        answered = float(self.answered.sum())
        if answered > 0:
            result["acc"] = float(self.correct.sum()) / answered
            result["answers"] = int(answered)
            result["acc_by_distance"] = {
                name: float(c / a) for name, c, a in zip(self.bucket_names, self.correct, self.answered) if a > 0
            }
        return result


class TokenDump(L.Callback):
    """Keeps the per-token results of every val/test pass in ``arrays[split]`` (see the module doc).

    Reads what ``LitLM.validation_step`` / ``test_step`` return: ``{"out": ModelOutput}``."""

    def __init__(self):
        self.arrays: dict[str, dict[str, np.ndarray]] = {}
        self._parts: list[dict[str, Tensor]] = []

    def _start(self, *_: Any) -> None:
        self._parts = []

    def _keep(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        out, targets = outputs["out"], batch["targets"]
        L_ = targets.shape[1]
        self._parts.append(
            {
                "token_loss": out.token_loss.float().cpu(),
                "targets": targets.cpu(),
                "loss_mask": batch["loss_mask"].cpu(),
                "distance": batch["distance"].cpu(),
                "correct": (out.logits.argmax(-1) == targets).cpu(),
                "position": (batch["offset"][:, None] + torch.arange(L_, device=targets.device)).cpu(),
            }
        )

    def _finish(self, split: str) -> None:
        if self._parts:
            self.arrays[split] = {k: torch.cat([p[k] for p in self._parts], dim=1).numpy() for k in self._parts[0]}
        self._parts = []

    on_validation_epoch_start = on_test_epoch_start = _start
    on_validation_batch_end = on_test_batch_end = _keep

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._finish("val")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._finish("test")
