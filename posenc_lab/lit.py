"""LightningModule around ``MemoryTransformer``: segment recurrence, metrics, exact resume.

Memory. Each of train / val / test keeps its own memory (``model.Recurrence``: the last ``mem_len``
hidden states of every layer, detached by the model) from one step to the next; a batch with ``reset``
drops it first (episode start). Val/test memory starts empty at every evaluation pass. The train memory
is saved in checkpoints, gathered over DDP ranks into the global stream order, so a run resumes on any
number of devices with the global batch it was trained with.

Exact resume. A checkpoint holds weights, optimizer, scheduler, loop counters (Lightning), the data
position (the datamodule's ``state_dict``), the train memory and the token count. Dropout noise is
reseeded at every step from (seed, step, rank), so the random state of step t does not depend on what
ran before it (validation passes, a restart): resuming gives the same next losses as never stopping.

Metrics (logged as ``train/*``, ``val/*``, ``test/*``): ``loss`` (nats per scored token), the corpus's
figure (``metrics.figure_name``: bpb, bpc or ppl), ``acc`` and ``acc_d{lo}-{hi}`` (argmax accuracy of
scored tokens that carry a distance, i.e. recall answers, overall and by distance bucket), ``lr``,
``tokens_per_s`` and ``tokens`` (global, cumulative). The val/test figures come from
``metrics.EvalStats`` (summed over DDP ranks); per-token results are kept by the ``metrics.TokenDump``
callback. Evaluation at other lengths: ``evaluate_at``. Checkpoint safety and health: ``checkpoints.py``;
the optimizer and its schedule: ``optim.py``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch import Tensor, nn

from . import optim as optimizer
from .checkpoints import CheckpointError, checkpoint_health, good_checkpoint, read_checkpoint
from .data import EVAL_SPLITS, SPLITS
from .data.registry import ANSWER_CORPORA
from .defaults import distance_buckets as default_buckets
from .defaults import optim_defaults
from .errors import PosencLabError
from .memory import Memory, Recurrence
from .metrics import EvalStats, figure, figure_name
from .model import MemoryTransformer, ModelConfig


class NonFiniteLossError(PosencLabError, FloatingPointError):
    """The training loss became NaN or infinite; raised at the next logged step (every trainer.log_every_n_steps),
    before its optimizer step, naming the step where it happened."""


class LoggedStepBar(TQDMProgressBar):
    """Lightning's progress bar, showing the training figures of the last logged step (``LitLM.shown``, read there):
    a figure logged to the bar is read from the device at every step after, a host sync. Drawn once a step
    (Lightning's draws twice); its figures are gathered again only when new ones were logged (``_figures``)."""

    _figures: tuple[Any, dict] | None = None  # (the LitLM.shown they hold, the figures)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        return {**super().get_metrics(trainer, pl_module), **getattr(pl_module, "shown", {})}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar, n = self.train_progress_bar, batch_idx + 1
        if bar is None or bar.disable or not self._should_update(n, bar.total):
            return
        shown = getattr(pl_module, "shown", None)
        if self._figures is None or self._figures[0] is not shown:  # LitLM.shown is a new dict at a logged step
            self._figures = (shown, self.get_metrics(trainer, pl_module))
        bar.n = n
        bar.set_postfix(self._figures[1])  # draws


def seed_step(seed: int, device: torch.device) -> None:
    """Seed the CPU's generator and, on a GPU, this device's: ``torch.manual_seed``'s noise without its cost, a seed
    queued with a formatted stack (a file read per frame) for every device kind not in use (a ms of a CPU step)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device: this rank's (Lightning sets it)
    elif device.type != "cpu":
        torch.manual_seed(seed)


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
    """model: ``ModelConfig`` fields (including vocab_size, posenc, posenc_kwargs); optim: conf/train.yaml's
    ``optim`` keys (None: its defaults); unit: the corpus unit ("byte" | "char" | "word"); distance_buckets:
    lower edges of the recall-accuracy buckets (None: conf/train.yaml's); config: the run's full resolved
    config (kept in the checkpoint so that evaluation can rebuild the data)."""

    def __init__(
        self,
        model: ModelConfig | dict[str, Any],
        optim: dict[str, Any] | None = None,
        unit: str = "byte",
        seed: int = 0,
        distance_buckets: Sequence[int] | None = None,
        config: dict[str, Any] | None = None,
    ):
        super().__init__()
        model = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        # the checkpoint keeps plain values (load_lit hands them back; torch.load reads no pickled class)
        hparams = dict(optim=optim, unit=unit, seed=seed, distance_buckets=distance_buckets, config=config)
        self.save_hyperparameters({"model": asdict(model), **hparams})
        self.model = MemoryTransformer(model)
        self.optim = {**optim_defaults(), **(optim or {})}
        self.unit, self.metric = unit, figure_name(unit)
        buckets = default_buckets() if distance_buckets is None else distance_buckets
        self.eval_stats = nn.ModuleDict({split: EvalStats(buckets) for split in EVAL_SPLITS})
        self.eval_lengths: dict[str, Any] = {}  # mem_len / same_length of val and test passes (evaluate_at)

        self.memory = {split: Recurrence() for split in SPLITS}
        self._pending_train_mems: list[Tensor] | None = None  # from a checkpoint, global streams
        self.eval_results: dict[str, dict[str, Any]] = {}  # the last val / test figures, plain floats
        self.train_tokens = 0  # global tokens consumed by training
        self._t_last: float | None = None
        self._tokens_last = 0  # train_tokens at _t_last
        self._first_bad: Tensor | None = None  # (step, batch index, loss) of a non-finite loss, on the device
        self._watched: list[tuple[Tensor, int, int]] = []  # (loss, step, batch index) since the last fold
        self._acc_counts: Tensor | None = None  # (correct, answered) since the last logged step, on the device
        self.shown: dict[str, float] = {}  # the training figures of the last logged step, for the progress bar
        self._answers = True  # the corpus carries recall answers (set from the datamodule; unknown: True)
        self._wall_offset = 0.0  # fit seconds before this invocation (from the checkpoint)
        self.stretches: list[dict[str, Any]] = []  # the schedules of the steps before this invocation (checkpoint)
        self.plan: dict[str, Any] | None = None  # the schedule of this invocation (optim.schedule)
        self._plan_from = 0  # the step this invocation started at
        self._stop_sources: list[L.Callback] = []  # the callbacks that can end training at a step (on_train_start)

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
        if datamodule is not None and getattr(datamodule, "name", None) is not None:
            self._answers = datamodule.name in ANSWER_CORPORA
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
        return self.memory[split].step(
            self.model,
            batch["tokens"],
            batch["targets"],
            reset=batch["reset"],  # read on the device: no host sync
            offset=batch["offset"],
            loss_mask=batch["loss_mask"],
            position_ids=batch.get("position_ids"),
            **self._lengths(split),
        )

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
            # saved as the valid slots only (the format of every version): back to mem_len static slots
            self.memory["train"].memory = Memory.of(mems, self.model.mem_len) if mems else None
            self._pending_train_mems = None
        self._t_last = None
        # what can end training at a step, found once; one process only: under DDP the signal reaches ranks apart,
        # and a rank-local decision to log would enter sync_dist's collective alone
        stops = [c for c in self.trainer.callbacks if hasattr(c, "stop_requested")]  # Checkpointing
        self._stop_sources = stops if self.trainer.world_size == 1 else []

    def on_train_end(self) -> None:
        self._check_finite()  # the steps since the last logged one

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        seed_step(self._step_seed(batch_idx), self.device)  # dropout noise depends on (seed, step, rank) only
        self.model.at_step(self.global_step)  # a scheme's schedule (DroPE) from the step alone, as the noise

    def _log_step(self) -> bool:
        """True on the steps whose metrics Lightning logs (every ``trainer.log_every_n_steps``): the only steps that
        read anything from the device. Outside a trainer (a bare call): every step."""
        if self._trainer is None or self.trainer._logger_connector.should_update_logs:
            return True
        return any(c.stop_requested for c in self._stop_sources)  # the step a stop ends is logged too

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """No host sync (tests/test_no_host_sync.py): the finite check and the recall accuracy accumulate on the
        device and are read every ``log_every_n_steps`` steps; the loss and figure are read by Lightning then."""
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
        self._watch_finite(loss.detach(), batch_idx)
        log_step = self._log_step()
        if log_step:  # before this step's update
            self._check_finite()

        B, L_ = batch["tokens"].shape
        self.train_tokens += B * L_ * world
        if log_step:  # not to the progress bar: Lightning reads its values at every step after (LoggedStepBar)
            logs = {"train/loss": loss, f"train/{self.metric}": figure(loss.detach(), self.unit)}
            self.log_dict(logs, sync_dist=world > 1, batch_size=B)
            self.shown = dict(zip(logs, torch.stack([v.detach().float() for v in logs.values()]).tolist()))
        if self._answers:  # argmax only for a corpus with answers: an adaptive softmax builds full-vocabulary scores
            answered = batch["loss_mask"] & (batch["distance"] >= 0)
            correct = (out.logits.detach().argmax(-1) == batch["targets"]) & answered
            counts = torch.stack([correct.sum(), answered.sum()]).float()
            self._acc_counts = counts if self._acc_counts is None else self._acc_counts + counts
        if log_step and self._acc_counts is not None:  # the answers since the last logged step
            counts, self._acc_counts = self._acc_counts, None
            if world > 1:  # every rank takes the same decision below (a collective inside log)
                counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
            correct, answered = counts.tolist()
            if answered > 0:
                self.log("train/acc", correct / answered, batch_size=B)
        return loss

    def configure_callbacks(self) -> list[L.Callback]:
        """Lightning's own progress bar (if the trainer has one) replaced by ``LoggedStepBar``."""
        bar = self._trainer.progress_bar_callback if self._trainer is not None else None
        if type(bar) is not TQDMProgressBar:
            return []
        return [LoggedStepBar(refresh_rate=bar.refresh_rate, process_position=bar.process_position, leave=bar._leave)]

    WATCH_FOLD = 256  # losses kept before they are folded on the device (no logged step may come)

    def _watch_finite(self, loss: Tensor, batch_idx: int) -> None:
        """Keep the loss for the check at the next logged step: no device work at the steps between."""
        self._watched.append((loss, self.global_step, batch_idx))
        if len(self._watched) >= self.WATCH_FOLD:
            self._fold_watched()

    def _fold_watched(self) -> None:
        """Keep (step, batch index, loss) of the first non-finite loss since the last check, on the device."""
        if not self._watched:
            return
        losses = torch.stack([w[0] for w in self._watched]).float()  # [n]
        at = torch.tensor([w[1:] for w in self._watched], dtype=torch.float32).to(losses.device, non_blocking=True)
        self._watched, bad = [], ~torch.isfinite(losses)
        first = bad.int().argmax().view(1)  # the first non-finite one (0 if none)
        now = torch.cat([at.index_select(0, first)[0], losses.index_select(0, first)])  # (step, batch index, loss)
        kept = torch.full_like(now, float("inf")) if self._first_bad is None else self._first_bad  # step inf: none yet
        self._first_bad = torch.where(bad.any() & torch.isinf(kept[0]), now, kept)

    def _check_finite(self) -> None:
        """Raise NonFiniteLossError if a loss since the last check was not finite (one host read)."""
        self._fold_watched()
        if self._first_bad is None:
            return
        first = self._first_bad
        if self.trainer.world_size > 1:  # every rank must take the same decision
            first = torch.cat([self.trainer.strategy.reduce(first[:2].clone(), reduce_op="min"), first[2:]])
        step, batch_idx, loss = first.tolist()
        if math.isfinite(step):
            raise NonFiniteLossError(self._non_finite_message(loss, int(step), int(batch_idx)))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """lr, tokens and tokens/s (over the steps since the last logged one) at the logged steps only: a number
        logged is a tensor made on the device, a copy that waits for it."""
        self.model.at_step(self.global_step)  # the weights now stand at this step: a validation pass evaluates them
        if not self._log_step():
            return
        now = time.perf_counter()
        if self._t_last is not None:
            tokens = self.train_tokens - self._tokens_last
            self.log("train/tokens_per_s", tokens / max(now - self._t_last, 1e-9), batch_size=1)
        self._t_last, self._tokens_last = now, self.train_tokens
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        self.log("train/tokens", float(self.train_tokens), batch_size=1)

    # ---- evaluation ------------------------------------------------------------------------

    def _eval_start(self, split: str) -> None:
        self.memory[split].clear()
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

    # ---- optimizer (optim.py) ----------------------------------------------------------------

    def configure_optimizers(self):
        return optimizer.configure(self.model, self.optim, self._trainer, self._schedule())

    def _schedule(self) -> dict[str, Any]:
        if self.plan is None:  # decided once, resuming: before the optimizer exists (on_load_checkpoint)
            self.plan = optimizer.schedule(self.optim, self._trainer, self.stretches[-1] if self.stretches else None)
        return self.plan

    def schedule_stretches(self) -> list[dict[str, Any]]:
        """The learning-rate schedule of every stretch of steps that led to the current weights (results.json)."""
        now = [{"from_step": self._plan_from, "to_step": self.global_step, **self.plan}] if self.plan else []
        return self.stretches + [s for s in now if s["to_step"] > s["from_step"]]

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
        memory = self.memory["train"].memory
        mems = memory.valid_states() if memory is not None else []  # the valid slots: today's format, and older
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
            "schedule": self.schedule_stretches(),
        }
        self.saved_health = health

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("posenc_lab")
        if state is None:
            raise ValueError("not a posenc-lab training checkpoint (no 'posenc_lab' entry)")
        if missing := sorted({"train_mems", "train_tokens", "wall_time_s", "schedule"} - set(state)):
            raise ValueError(
                f"a checkpoint of a development version of posenc-lab (its 'posenc_lab' entry lacks "
                f"{', '.join(missing)}); train the run again"
            )
        self._pending_train_mems = list(state["train_mems"]) or None
        self.train_tokens, self._wall_offset = int(state["train_tokens"]), float(state["wall_time_s"])
        self.loaded_health = state.get("health")
        self.stretches, self._plan_from = optimizer.stretches(checkpoint), int(checkpoint.get("global_step", 0))
        self.model.at_step(self._plan_from)  # the weights' step: an evaluation of a checkpoint sees what it trained
        if self._trainer is not None and checkpoint.get("hyper_parameters", {}).get("optim") != self.hparams.optim:
            optimizer.use_settings(checkpoint, self.optim, self._schedule())

    def _non_finite_message(self, loss: float, step: int, batch_idx: int) -> str:
        directory = getattr(self.trainer.checkpoint_callback, "dirpath", None)
        good = good_checkpoint(directory) if directory else None
        where = (
            f"Last good checkpoint: {good} (see SANE_* in posenc_lab/checkpoints.py); continue from it in a new "
            f"run directory with a lower learning rate: resume={good} run_dir=NEW_DIR optim.lr=LOWER"
            if good
            else "No good checkpoint was saved before it (lower checkpoint_every to keep more)"
        )
        return (
            f"non-finite training loss ({loss}) at step {step} (batch index {batch_idx}); stopped at step "
            f"{self.global_step}, before its update (the loss is checked every trainer.log_every_n_steps). {where}. "
            f"Try a lower optim.lr, longer optim.warmup_steps or "
            f"trainer.gradient_clip_val."
        )
