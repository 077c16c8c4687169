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
distance bucket), ``lr``, ``tokens_per_s`` and ``tokens`` (global, cumulative). The val/test
figures come from ``posenc_lab.metrics.EvalStats`` (summed over DDP ranks); per-token results are
kept by the ``posenc_lab.metrics.TokenDump`` callback. Evaluation at other lengths: ``evaluate_at``.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import shutil
import time
import zipfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from .errors import PosencLabError
from .metrics import DEFAULT_BUCKETS, SPLITS, EvalStats, bucket_labels, figure, figure_name, logged_metrics  # noqa: F401 - their home before posenc_lab.metrics
from .model import MemoryTransformer, ModelConfig

DEFAULT_OPTIM = dict(
    lr=1e-3, weight_decay=0.01, warmup_steps=100, min_lr_ratio=0.1, betas=(0.9, 0.95), eps=1e-8, total_steps=None
)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1 over ``warmup_steps``, then cosine decay to ``min_lr_ratio``
    at ``total_steps`` (and flat after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class NonFiniteLossError(PosencLabError, FloatingPointError):
    """The training loss became NaN or infinite; raised before the optimizer step."""


class CheckpointError(PosencLabError, ValueError):
    """A checkpoint cannot be read or does not fit; the message names the file and what is wrong."""


# Checkpoints carry data, never code: they are read with torch.load(weights_only=True), whose
# unpickler builds only tensors, dicts (also OrderedDict), lists, tuples, sets, numbers, strings
# and None. That is all a posenc-lab checkpoint holds (Lightning's entries included; the
# hyper-parameters are plain containers, see train.build_lit), so nothing more is allowed here.
# A file that needs any other global (a class, a function) is refused before it is unpickled.
CHECKPOINT_SAFE_GLOBALS: list = []

# A checkpoint is called good only if (1) when saved, every weight, optimizer moment and memory
# state was finite and no weight or memory value beyond these magnitudes (trained weights are O(1),
# the residual stream O(10-100); a diverging run reaches 1e6 and more), and (2) the training step
# right after it, from exactly its weights and memory, gave a finite loss of at most SANE_LOSS_RATIO
# times the loss of a uniform guess, ln(vocab_size) (a model far worse than guessing is broken).
SANE_WEIGHT_ABS = 1e4
SANE_MEMORY_ABS = 1e6
SANE_LOSS_RATIO = 2.0


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
    except pickle.UnpicklingError as e:  # the weights-only unpickler met something that is not data
        found = re.search(r"Unsupported (global: GLOBAL \S+|operand \d+)", str(e))
        raise _refused(path, found.group(0) if found else "objects other than tensors and plain data") from None
    except Exception as e:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"checkpoint {path} cannot be read (corrupt or not a checkpoint): {type(e).__name__}: {e}"
        ) from e
    missing = (
        [k for k in ("state_dict", "hyper_parameters", "posenc_lab") if k not in ckpt]
        if isinstance(ckpt, dict)
        else ["everything"]
    )
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a posenc-lab training checkpoint (missing {missing})")
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


GOOD_CHECKPOINTS = ("good.ckpt", "good.prev.ckpt")  # the newest two good ones, newest first
_CANDIDATE = ".candidate.ckpt"  # the newest healthy checkpoint, until the next step confirms it


def _link(src: Path, dst: Path) -> None:
    """Atomically make ``dst`` a hard link to ``src`` (a copy where hard links do not exist)."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


class Checkpointing(ModelCheckpoint):
    """Lightning's ModelCheckpoint that also keeps the newest two good checkpoints (see SANE_*) as
    good.ckpt and good.prev.ckpt: hard links, so no copy while the file they were saved as lives.
    A divergence that spans several checkpoints still leaves a good one, whatever was overwritten."""

    _candidate_step: int | None = None

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        health = getattr(trainer.lightning_module, "saved_health", None)
        if trainer.is_global_zero and health and health["ok"] and Path(filepath).is_file():
            _link(Path(filepath), Path(filepath).parent / _CANDIDATE)
            self._candidate_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: LitLM) -> None:
        super().on_train_start(trainer, pl_module)
        # The checkpoint this fit resumed from is a candidate too (a new run directory may have no other).
        health = getattr(pl_module, "loaded_health", None)
        if trainer.is_global_zero and trainer.ckpt_path and health and health["ok"]:
            Path(self.dirpath).mkdir(parents=True, exist_ok=True)
            _link(Path(trainer.ckpt_path), Path(self.dirpath) / _CANDIDATE)
            self._candidate_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: LitLM, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # trainer.global_step already counts this step's update: the loss came from step global_step - 1
        if self._candidate_step is not None and self._candidate_step == trainer.global_step - 1:
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float("nan")
            candidate = Path(self.dirpath) / _CANDIDATE
            if loss <= SANE_LOSS_RATIO * math.log(pl_module.model.cfg.vocab_size) and candidate.is_file():
                good, prev = (candidate.parent / name for name in GOOD_CHECKPOINTS)
                if good.exists():
                    os.replace(good, prev)
                os.replace(candidate, good)
            self._candidate_step = None
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def good_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest good checkpoint kept in ``directory`` (``Checkpointing``), or None."""
    for name in GOOD_CHECKPOINTS:
        try:
            read_checkpoint(Path(directory) / name)
            return Path(directory) / name
        except CheckpointError:
            continue
    return None


def load_lit(ckpt_path: str | os.PathLike, checkpoint: dict[str, Any] | None = None) -> LitLM:
    """The LitLM of a training checkpoint (weights and hyper-parameters), on the CPU, in eval mode.
    ``checkpoint``: the file's contents if already read (``read_checkpoint``)."""
    ckpt = read_checkpoint(ckpt_path) if checkpoint is None else checkpoint
    try:
        lit = LitLM(**ckpt["hyper_parameters"])
        lit.load_state_dict(ckpt["state_dict"])
        lit.on_load_checkpoint(ckpt)
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(
            f"checkpoint {ckpt_path} does not fit this version of posenc-lab: {type(e).__name__}: {e}"
        ) from e
    return lit.eval()


class LitLM(L.LightningModule):
    """model: ``ModelConfig`` fields (including vocab_size, posenc, posenc_kwargs); optim: see
    ``DEFAULT_OPTIM``; unit: the corpus unit ("byte" | "char" | "word"); distance_buckets: lower
    edges of the recall-accuracy buckets; config: the run's full resolved config (kept in the
    checkpoint so that evaluation can rebuild the data)."""

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any] | None = None,
        unit: str = "byte",
        seed: int = 0,
        distance_buckets: Sequence[int] = DEFAULT_BUCKETS,
        config: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = MemoryTransformer(ModelConfig(**model))
        self.optim = {**DEFAULT_OPTIM, **(optim or {})}
        self.unit, self.metric = unit, figure_name(unit)
        self.eval_stats = nn.ModuleDict({split: EvalStats(distance_buckets) for split in SPLITS[1:]})
        self.eval_lengths: dict[str, Any] = {}  # mem_len / same_length of val and test passes (evaluate_at)

        self._mems: dict[str, list[Tensor] | None] = dict.fromkeys(SPLITS)
        self._pending_train_mems: list[Tensor] | None = None  # from a checkpoint, global streams
        self.eval_results: dict[str, dict[str, Any]] = {}  # the last val / test figures, plain floats
        self.train_tokens = 0  # global tokens consumed by training
        self._t_last: float | None = None
        self._wall_offset = 0.0  # fit seconds before this invocation (from the checkpoint)

    # ---- checks before any step ------------------------------------------------------------

    def check_data(self, datamodule, splits: Sequence[str]) -> None:
        """Raise ValueError if the data cannot work with this model (vocabulary, lengths)."""
        cfg = self.model.cfg
        if datamodule.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"data.name={datamodule.name} has a vocabulary of {datamodule.vocab_size} tokens, "
                f"the model has vocab_size={cfg.vocab_size}"
            )
        for split in splits:
            segment_len, max_position = datamodule.lengths(split)
            mem_len = self._lengths(split).get("mem_len", cfg.mem_len)
            try:
                self.model.validate_lengths(segment_len, mem_len, max_position)
            except ValueError as e:
                raise ValueError(
                    f"posenc={cfg.posenc} cannot serve the {split} data (segments up to {segment_len} tokens, "
                    f"positions up to {max_position} since an episode start, model.mem_len={mem_len}; "
                    f"see data.segment_len, data.episode_len, model.mem_len): {e}"
                ) from e

    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "lengths"):
            splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
            self.check_data(datamodule, splits)

    # ---- the recurrent step ----------------------------------------------------------------

    def evaluate_at(self, mem_len: int | None = None, same_length: bool | None = None) -> None:
        """Run the val / test passes with memory ``mem_len`` and the same-length mask (None: as trained);
        handed to the model's forward pass, the model itself is not changed."""
        lengths = {k: v for k, v in (("mem_len", mem_len), ("same_length", same_length)) if v is not None}
        cfg = self.model.cfg
        if lengths.get("same_length", cfg.same_length) and lengths.get("mem_len", cfg.mem_len) < 1:
            raise ValueError("same_length=true needs mem_len >= 1 (each query sees mem_len + 1 keys)")
        self.eval_lengths = lengths

    def _lengths(self, split: str) -> dict[str, Any]:
        return {} if split == "train" else self.eval_lengths

    def forward_segment(self, batch: dict[str, Tensor], split: str):
        """Run one segment with the memory of ``split`` and keep the new memory."""
        mems = None if bool(batch["reset"]) else self._mems[split]
        out = self.model(
            batch["tokens"],
            batch["targets"],
            mems=mems,
            offset=batch["offset"],
            loss_mask=batch["loss_mask"],
            **self._lengths(split),
        )
        self._mems[split] = out.mems
        return out

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
                mems.append(m[rank * b : (rank + 1) * b].to(self.device))
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
            n_local = out.counted.sum().float()
            n_global = self.trainer.strategy.reduce(n_local.clone(), reduce_op="sum")
            loss = loss * n_local * world / n_global.clamp(min=1.0)
        finite = bool(torch.isfinite(loss))
        if world > 1:
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            raise NonFiniteLossError(self._non_finite_message(loss, batch_idx))

        B, L_ = batch["tokens"].shape
        self.train_tokens += B * L_ * world
        logs = {"train/loss": loss, f"train/{self.metric}": figure(loss.detach(), self.unit)}
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

    # ---- evaluation ------------------------------------------------------------------------

    def _eval_start(self, split: str) -> None:
        self._mems[split] = None
        self.eval_stats[split].reset()

    def _eval_step(self, batch: dict[str, Tensor], split: str) -> dict[str, Any]:
        """One segment into the split's statistics; returns {"out": ModelOutput} for callbacks (TokenDump)."""
        out = self.forward_segment(batch, split)
        mask, distance, targets = batch["loss_mask"], batch["distance"], batch["targets"]
        # argmax only where there are answers: an adaptive softmax builds full-vocabulary scores for it
        correct = out.logits.argmax(-1) == targets if (mask & (distance >= 0)).any() else None
        self.eval_stats[split].update(out.token_loss, mask, distance, correct)
        return {"out": out}

    def _eval_end(self, split: str) -> None:
        result = self.eval_stats[split].compute()  # summed over DDP ranks
        result = {"loss": result["loss"], self.metric: float(figure(result["loss"], self.unit)), **result}
        self.eval_results[split] = result
        logs = {f"{split}/{k}": v for k, v in result.items() if k in ("loss", self.metric, "acc")}
        logs.update({f"{split}/acc_d{k}": v for k, v in result.get("acc_by_distance", {}).items()})
        self.log_dict(logs, sync_dist=False, batch_size=1)
        self._t_last = None  # tokens/s must not count the evaluation pause

    def on_validation_epoch_start(self) -> None:
        self._eval_start("val")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_start(self) -> None:
        self._eval_start("test")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # ---- optimizer -------------------------------------------------------------------------

    def _adamw_kernel(self) -> dict:
        """The fused AdamW (one kernel for all tensors, CPU and CUDA; the loop version costs a pass per
        tensor), except under mixed precision with gradient clipping: Lightning refuses to clip for an
        optimizer that unscales its own gradients, and the fused one declares that it does. There the
        multi-tensor (foreach) kernel serves."""
        trainer = self._trainer
        mixed = trainer is not None and str(trainer.precision).endswith("-mixed")
        clipped = trainer is not None and bool(trainer.gradient_clip_val)
        return {"foreach": True} if mixed and clipped else {"fused": True}

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
            lr=float(o["lr"]),
            betas=tuple(o["betas"]),
            eps=float(o["eps"]),
            **self._adamw_kernel(),
        )
        total = o.get("total_steps") or self.trainer.max_steps
        if total is None or total < 1:
            raise ValueError(
                "the learning-rate schedule needs the run length: set trainer.max_steps (or optim.total_steps)"
            )
        schedule = partial(
            warmup_cosine,
            warmup_steps=int(o["warmup_steps"]),
            total_steps=int(total),
            min_lr_ratio=float(o["min_lr_ratio"]),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoints -----------------------------------------------------------------------

    def _global_streams(self, t: Tensor) -> Tensor:
        """[b, ...] of this rank -> [B, ...] of all ranks, in global stream order (all ranks call this)."""
        if self.trainer.world_size == 1:
            return t
        return self.all_gather(t).flatten(0, 1)

    def on_fit_start(self) -> None:
        self._fit_t0 = time.perf_counter()

    def wall_time_s(self) -> float:
        """Seconds spent in fit, summed over the invocations that led to this state (the part of an
        interrupted invocation after its last checkpoint is not counted: that work was redone)."""
        t0 = getattr(self, "_fit_t0", None)
        return self._wall_offset + (time.perf_counter() - t0 if t0 is not None else 0.0)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        mems = self._mems["train"] or []
        if self._pending_train_mems is not None:  # saved again before training resumed
            mems_global = self._pending_train_mems
        else:
            mems_global = [self._global_streams(m.contiguous()).cpu() for m in mems]
        health = checkpoint_health(checkpoint["state_dict"], mems_global, checkpoint.get("optimizer_states", ()))
        checkpoint["posenc_lab"] = {
            "version": 1,
            "train_mems": mems_global,
            "train_tokens": self.train_tokens,
            "wall_time_s": self.wall_time_s(),
            "health": health,
        }
        self.saved_health = health

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("posenc_lab")
        if state is None:
            raise ValueError("not a posenc-lab training checkpoint (no 'posenc_lab' entry)")
        self._pending_train_mems = list(state["train_mems"]) or None
        self.train_tokens = int(state["train_tokens"])
        self._wall_offset = float(state.get("wall_time_s", 0.0))
        self.loaded_health = state.get("health")
        if self._trainer is not None and checkpoint.get("hyper_parameters", {}).get("optim") != self.hparams.optim:
            self._use_current_optim_settings(checkpoint)

    def _use_current_optim_settings(self, checkpoint: dict[str, Any]) -> None:
        """Resuming with other optimizer settings (e.g. a lower lr after a divergence) must train with
        them: Lightning restores the saved lr, betas, ... into the optimizer and scheduler after this hook."""
        o = self.optim
        lr, factor = float(o["lr"]), 1.0
        for sched in checkpoint.get("lr_schedulers", []):
            total = o.get("total_steps") or self.trainer.max_steps
            factor = warmup_cosine(
                int(sched.get("last_epoch", 0)), int(o["warmup_steps"]), int(total), float(o["min_lr_ratio"])
            )
            sched["base_lrs"] = [lr] * len(sched.get("base_lrs", []))
            sched["_last_lr"] = [lr * factor] * len(sched.get("base_lrs", []))
        for state in checkpoint.get("optimizer_states", []):
            for i, group in enumerate(state.get("param_groups", [])):
                group.update(
                    lr=lr * factor,
                    initial_lr=lr,
                    betas=tuple(o["betas"]),
                    eps=float(o["eps"]),
                    weight_decay=float(o["weight_decay"]) if i == 0 else 0.0,
                )  # see configure_optimizers

    def _non_finite_message(self, loss: Tensor, batch_idx: int) -> str:
        directory = getattr(self.trainer.checkpoint_callback, "dirpath", None)
        good = good_checkpoint(directory) if directory else None
        where = (
            f"Last good checkpoint: {good} (see SANE_* in posenc_lab/lit.py); continue from it in a new run "
            f"directory with a lower learning rate: resume={good} run_dir=NEW_DIR optim.lr=LOWER"
            if good
            else "No good checkpoint was saved before it (lower checkpoint_every to keep more)"
        )
        return (
            f"non-finite training loss ({loss.item()}) at step {self.global_step} (batch index {batch_idx}); "
            f"stopped before the update. {where}. Try a lower optim.lr, longer optim.warmup_steps or "
            f"trainer.gradient_clip_val."
        )
