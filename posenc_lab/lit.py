"""LightningModule around ``MemoryTransformer``: segment recurrence, metrics, optimizer, exact resume.

Memory. Each of train / val / test keeps its own memory (the last ``mem_len`` hidden states of
every layer, detached by the model) from one step to the next; a batch with ``reset`` drops it
first (episode start). Val/test memory starts empty at every evaluation pass. The train memory
is saved in checkpoints, gathered over DDP ranks into the global stream order, so a run resumes
on any number of devices with the global batch it was trained with.

Exact resume. A checkpoint holds weights, optimizer, scheduler, loop counters (Lightning), the
data position (the datamodule's ``state_dict``), the train memory and the token count. Dropout
noise is reseeded at every step from (seed, step, rank), so the random state of step t does not
depend on what ran before it (validation passes, a restart): resuming gives the same next losses
as never stopping.

Metrics (logged as ``train/*``, ``val/*``, ``test/*``): loss (nats per scored token), ``bpt``
(bits per token, byte/char corpora) or ``ppl`` (word corpora), ``acc`` and ``acc_d{lo}-{hi}``
(argmax accuracy of scored tokens that carry a distance, i.e. recall answers, overall and by
distance bucket), ``lr``, ``tokens_per_s`` and ``tokens`` (global, cumulative).
"""

from __future__ import annotations

import math
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from .model import MemoryTransformer, ModelConfig

SPLITS = ("train", "val", "test")
DEFAULT_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_OPTIM = dict(lr=1e-3, weight_decay=0.01, warmup_steps=100, min_lr_ratio=0.1, betas=(0.9, 0.95), eps=1e-8,
                     total_steps=None)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1 over ``warmup_steps``, then cosine decay to ``min_lr_ratio``
    at ``total_steps`` (and flat after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """[1, 8, 16] -> ["1-7", "8-15", "16+"]."""
    return [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])] + [f"{edges[-1]}+"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; raised before the optimizer step."""


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit; the message names the file and what is wrong."""


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a posenc-lab training checkpoint on the CPU, or raise CheckpointError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise CheckpointError(f"checkpoint {path} cannot be read (corrupt or not a checkpoint): "
                              f"{type(e).__name__}: {e}") from e
    missing = [k for k in ("state_dict", "hyper_parameters", "posenc_lab") if k not in ckpt] \
        if isinstance(ckpt, dict) else ["everything"]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a posenc-lab training checkpoint (missing {missing})")
    return ckpt


def load_lit(ckpt_path: str | os.PathLike, checkpoint: dict[str, Any] | None = None) -> "LitLM":
    """The LitLM of a training checkpoint (weights and hyper-parameters), on the CPU, in eval mode.
    ``checkpoint``: the file's contents if already read (``read_checkpoint``)."""
    ckpt = read_checkpoint(ckpt_path) if checkpoint is None else checkpoint
    try:
        lit = LitLM(**ckpt["hyper_parameters"])
        lit.load_state_dict(ckpt["state_dict"])
        lit.on_load_checkpoint(ckpt)
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"checkpoint {ckpt_path} does not fit this version of posenc-lab: "
                              f"{type(e).__name__}: {e}") from e
    return lit.eval()


class LitLM(L.LightningModule):
    """model: ``ModelConfig`` fields (including vocab_size, posenc, posenc_kwargs); optim: see
    ``DEFAULT_OPTIM``; unit: the corpus unit ("byte" | "char" | "word"); distance_buckets: lower
    edges of the recall-accuracy buckets; config: the run's full resolved config (kept in the
    checkpoint so that evaluation can rebuild the data)."""

    def __init__(self, model: dict[str, Any], optim: dict[str, Any] | None = None, unit: str = "byte",
                 seed: int = 0, distance_buckets: Sequence[int] = DEFAULT_BUCKETS,
                 config: dict[str, Any] | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.model = MemoryTransformer(ModelConfig(**model))
        self.optim = {**DEFAULT_OPTIM, **(optim or {})}
        self.metric = "ppl" if unit == "word" else "bpt"
        edges = sorted(int(e) for e in distance_buckets)
        if not edges or edges[0] < 0:
            raise ValueError(f"distance_buckets must be non-empty lower edges >= 0, got {list(distance_buckets)}")
        self.register_buffer("bucket_edges", torch.tensor(edges), persistent=False)
        self.bucket_names = bucket_labels(edges)

        self._mems: dict[str, list[Tensor] | None] = dict.fromkeys(SPLITS)
        self._pending_train_mems: list[Tensor] | None = None  # from a checkpoint, global streams
        self._stats: dict[str, dict[str, Tensor]] = {}
        self.eval_results: dict[str, dict[str, Any]] = {}  # the last val / test figures, plain floats
        self.train_tokens = 0  # global tokens consumed by training
        self.collect_token_losses = False  # evaluate.py: keep per-token losses of val/test passes
        self.token_losses: dict[str, dict[str, np.ndarray]] = {}
        self._collected: list[dict[str, Tensor]] = []
        self._t_last: float | None = None

    # ---- checks before any step ------------------------------------------------------------

    def check_data(self, datamodule, splits: Sequence[str]) -> None:
        """Raise ValueError if the data cannot work with this model (vocabulary, lengths)."""
        cfg = self.model.cfg
        if datamodule.vocab_size != cfg.vocab_size:
            raise ValueError(f"data.name={datamodule.name} has a vocabulary of {datamodule.vocab_size} tokens, "
                             f"the model has vocab_size={cfg.vocab_size}")
        for split in splits:
            segment_len, max_position = datamodule.lengths(split)
            try:
                self.model.validate_lengths(segment_len, self.model.mem_len, max_position)
            except ValueError as e:
                raise ValueError(
                    f"posenc={cfg.posenc} cannot serve the {split} data (segments up to {segment_len} tokens, "
                    f"positions up to {max_position} since an episode start, model.mem_len={self.model.mem_len}; "
                    f"see data.segment_len, data.episode_len, model.mem_len): {e}") from e

    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "lengths"):
            splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
            self.check_data(datamodule, splits)

    # ---- the recurrent step ----------------------------------------------------------------

    def forward_segment(self, batch: dict[str, Tensor], split: str):
        """Run one segment with the memory of ``split`` and keep the new memory."""
        mems = None if bool(batch["reset"]) else self._mems[split]
        out = self.model(batch["tokens"], batch["targets"], mems=mems, offset=batch["offset"],
                         loss_mask=batch["loss_mask"])
        self._mems[split] = out.mems
        return out

    def _scored(self, batch: dict[str, Tensor]) -> Tensor:
        """[B, L] tokens that count in the training loss: loss_mask and the recent-fraction cut."""
        mask = batch["loss_mask"]
        L_ = mask.shape[1]
        recent = math.ceil(self.model.cfg.loss_recent_frac * L_)
        if recent < L_:
            mask = mask & (torch.arange(L_, device=mask.device) >= L_ - recent)
        return mask

    # ---- training --------------------------------------------------------------------------

    def _step_seed(self, batch_idx: int) -> int:
        """Seed of the dropout noise of one training batch: (seed, step, micro-batch, rank)."""
        micro = batch_idx % self.trainer.accumulate_grad_batches
        key = [int(self.hparams.seed) & 0xFFFFFFFF, self.global_step, micro, self.global_rank]
        return int(np.random.SeedSequence(key).generate_state(1)[0])

    def on_train_start(self) -> None:
        if self._pending_train_mems is not None:  # this rank's block of the saved global streams
            rank, world = self.global_rank, self.trainer.world_size
            mems = []
            for m in self._pending_train_mems:
                b = m.shape[0] // world
                mems.append(m[rank * b:(rank + 1) * b].to(self.device))
            self._mems["train"] = mems or None
            self._pending_train_mems = None
        self._t_last = None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        torch.manual_seed(self._step_seed(batch_idx))  # dropout noise depends on (seed, step, rank) only

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        out = self.forward_segment(batch, "train")
        loss = out.loss
        world = self.trainer.world_size
        if world > 1:
            # Normalise by the *global* count of scored tokens, so that DDP's gradient average
            # equals the single-process gradient of the global batch (recall scores few tokens,
            # and their count differs between ranks).
            n_local = self._scored(batch).sum().float()
            n_global = self.trainer.strategy.reduce(n_local.clone(), reduce_op="sum")
            loss = loss * n_local * world / n_global.clamp(min=1.0)
        finite = bool(torch.isfinite(loss))
        if world > 1:
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "") or "none saved yet"
            raise NonFiniteLossError(
                f"non-finite training loss ({loss.item()}) at step {self.global_step} (batch index {batch_idx}); "
                f"stopped before the update. Last good checkpoint: {ckpt}. Try a lower optim.lr, longer "
                f"optim.warmup_steps or trainer.gradient_clip_val.")

        B, L_ = batch["tokens"].shape
        self.train_tokens += B * L_ * world
        logs = {"train/loss": loss, f"train/{self.metric}": self._figure(loss.detach())}
        answered = batch["loss_mask"] & (batch["distance"] >= 0)
        # argmax only where there are answers: an adaptive softmax builds full-vocabulary scores for it
        correct = (out.logits.detach().argmax(-1) == batch["targets"]) & answered if answered.any() else answered
        counts = torch.stack([correct.sum(), answered.sum()]).float()
        if world > 1:  # every rank must take the same decision below (a collective inside log)
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
        self.log_dict(logs, prog_bar=True, sync_dist=world > 1, batch_size=B)
        if counts[1] > 0:
            self.log("train/acc", counts[0] / counts[1], batch_size=B)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._t_last is not None:
            tokens = batch["tokens"].numel() * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / max(now - self._t_last, 1e-9), batch_size=1)
        self._t_last = now
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        self.log("train/tokens", float(self.train_tokens), batch_size=1)

    def _figure(self, loss: Tensor) -> Tensor:
        return loss.exp() if self.metric == "ppl" else loss / math.log(2)

    # ---- evaluation ------------------------------------------------------------------------

    def _eval_start(self, split: str) -> None:
        self._mems[split] = None
        n = len(self.bucket_names)
        dev = self.device
        self._stats[split] = {"loss_sum": torch.zeros((), dtype=torch.float64, device=dev),
                              "tokens": torch.zeros((), dtype=torch.float64, device=dev),
                              "answered": torch.zeros(n, dtype=torch.float64, device=dev),
                              "correct": torch.zeros(n, dtype=torch.float64, device=dev)}
        self._collected = []

    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        out = self.forward_segment(batch, split)
        mask, distance, targets = batch["loss_mask"], batch["distance"], batch["targets"]
        stats = self._stats[split]
        stats["loss_sum"] += (out.token_loss.double() * mask).sum()
        stats["tokens"] += mask.sum()
        answered = mask & (distance >= 0)
        # argmax only when needed: an adaptive softmax builds full-vocabulary scores for it
        needed = self.collect_token_losses or answered.any()
        predicted = out.logits.argmax(-1) if needed else torch.full_like(targets, -1)
        bucket = (torch.bucketize(distance, self.bucket_edges, right=True) - 1).clamp(min=0)
        n = len(self.bucket_names)
        stats["answered"] += torch.bincount(bucket[answered], minlength=n)[:n].double()
        stats["correct"] += torch.bincount(bucket[answered & (predicted == targets)], minlength=n)[:n].double()
        if self.collect_token_losses:
            L_ = targets.shape[1]
            self._collected.append({
                "token_loss": out.token_loss.float().cpu(), "targets": targets.cpu(), "loss_mask": mask.cpu(),
                "distance": distance.cpu(), "correct": (predicted == targets).cpu(),
                "position": (batch["offset"][:, None] + torch.arange(L_, device=targets.device)).cpu()})

    def _eval_end(self, split: str) -> None:
        stats = {k: self.trainer.strategy.reduce(v, reduce_op="sum") if self.trainer.world_size > 1 else v
                 for k, v in self._stats[split].items()}
        tokens = float(stats["tokens"])
        loss = float(stats["loss_sum"]) / max(tokens, 1.0)
        result: dict[str, Any] = {"loss": loss, self.metric: float(self._figure(torch.tensor(loss))),
                                  "tokens": int(tokens)}
        answered = float(stats["answered"].sum())
        if answered > 0:
            result["acc"] = float(stats["correct"].sum()) / answered
            result["answers"] = int(answered)
            result["acc_by_distance"] = {
                name: float(c / a) for name, c, a in zip(self.bucket_names, stats["correct"], stats["answered"]) if a > 0}
        self.eval_results[split] = result
        logs = {f"{split}/{k}": v for k, v in result.items() if k in ("loss", self.metric, "acc")}
        logs.update({f"{split}/acc_d{k}": v for k, v in result.get("acc_by_distance", {}).items()})
        self.log_dict(logs, sync_dist=False, batch_size=1)
        if self.collect_token_losses and self._collected:
            self.token_losses[split] = {k: torch.cat([c[k] for c in self._collected], dim=1).numpy()
                                        for k in self._collected[0]}
        self._collected = []
        self._t_last = None  # tokens/s must not count the evaluation pause

    def on_validation_epoch_start(self) -> None:
        self._eval_start("val")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_start(self) -> None:
        self._eval_start("test")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # ---- optimizer -------------------------------------------------------------------------

    def configure_optimizers(self):
        o = self.optim
        # Weight decay on the matrices of linear maps only: not on embeddings (tied with the
        # output head), positional tables and vectors, norms or biases.
        linear = {id(m.weight) for m in self.model.modules() if isinstance(m, nn.Linear)}
        embedding = {id(m.weight) for m in self.model.modules() if isinstance(m, nn.Embedding)}
        decay, no_decay = [], []
        for p in self.model.parameters():
            if p.requires_grad:
                (decay if id(p) in linear - embedding else no_decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": float(o["weight_decay"])}, {"params": no_decay, "weight_decay": 0.0}],
            lr=float(o["lr"]), betas=tuple(o["betas"]), eps=float(o["eps"]),
            fused=True)  # one kernel for all tensors (CPU and CUDA); the loop version costs a pass per tensor
        total = o.get("total_steps") or self.trainer.max_steps
        if total is None or total < 1:
            raise ValueError("the learning-rate schedule needs the run length: set trainer.max_steps "
                             "(or optim.total_steps)")
        schedule = partial(warmup_cosine, warmup_steps=int(o["warmup_steps"]), total_steps=int(total),
                           min_lr_ratio=float(o["min_lr_ratio"]))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoints -----------------------------------------------------------------------

    def _global_streams(self, t: Tensor) -> Tensor:
        """[b, ...] of this rank -> [B, ...] of all ranks, in global stream order (all ranks call this)."""
        if self.trainer.world_size == 1:
            return t
        return self.all_gather(t).flatten(0, 1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        mems = self._mems["train"] or []
        if self._pending_train_mems is not None:  # saved again before training resumed
            mems_global = self._pending_train_mems
        else:
            mems_global = [self._global_streams(m.contiguous()).cpu() for m in mems]
        checkpoint["posenc_lab"] = {"version": 1, "train_mems": mems_global, "train_tokens": self.train_tokens}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("posenc_lab")
        if state is None:
            raise ValueError("not a posenc-lab training checkpoint (no 'posenc_lab' entry)")
        self._pending_train_mems = list(state["train_mems"]) or None
        self.train_tokens = int(state["train_tokens"])
