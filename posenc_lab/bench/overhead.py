"""The training step outside the model: ``python -m posenc_lab.bench overhead`` (``posenc-lab bench overhead``).

By interleaved rounds (odd rounds in the other order), at each model preset, two loops over the same batches of
the run's own data stream, from the same initial weights:

- ``bare``: the model's forward with memory (``Recurrence.step``, as ``LitLM.forward_segment`` calls it), backward,
  gradient clipping at ``trainer.gradient_clip_val``, the AdamW step, its schedule and ``zero_grad``; the batches
  drawn beforehand. The arithmetic of a training step and nothing else.
- ``fit``: ``Trainer.fit`` of ``posenc-lab train``, built from the composed ``conf/`` by ``posenc_lab.build`` as
  ``train.py`` builds it (LitLM, the checkpoint callback with its stop signals, the CSV logger, the progress bar,
  data loading), timed from one ``on_train_batch_start`` to the next, so a step counts everything between two
  batches: the fetch, Lightning's loop and every hook.

The overhead per step is ``fit - bare``, paired within a round. A figure is the mean over ``--steps`` steps after
``--warmup`` (a multiple of ``trainer.log_every_n_steps`` counts the logged steps in their share). Periodic
validation and checkpoints are kept out of the window (they are per run, not per step: ``val_check_interval`` and
``checkpoint_every`` are set past it), as is the sanity check. The progress bar writes to /dev/null (as in a run
whose output goes to a file). ``--profile`` prints cProfile's top functions over the fit window of the last round.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import torch

from .. import optim as optimizer
from ..build import build_datamodule, build_lit, build_trainer
from ..checkpoints import Checkpointing
from ..checks import problems as check_problems
from ..compose import compose, override_problem
from ..memory import Recurrence
from ..slurm import stop_signals
from ..tables import text_row, text_table
from .configs import model_presets
from .probes import environment_line


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock(L.Callback):
    """Wall and process CPU time at the start of training batch ``warmup`` and ``warmup + steps`` (the device
    drained there only); ``losses``: each step's loss (detached), if asked; ``profiler`` runs over the window."""

    def __init__(self, warmup: int, steps: int, keep_losses: bool = False, profiler: cProfile.Profile | None = None):
        self.warmup, self.steps, self.keep_losses, self.profiler = warmup, steps, keep_losses, profiler
        self.starts = 0
        self.marks: list[tuple[float, float]] = []
        self.losses: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.starts in (self.warmup, self.warmup + self.steps):
            _sync(pl_module.device)
            self.marks.append((time.perf_counter(), time.process_time()))
            if self.profiler is not None:
                (self.profiler.enable if len(self.marks) == 1 else self.profiler.disable)()
        self.starts += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.keep_losses:
            self.losses.append(outputs["loss"].detach())


def overrides(preset: str, warmup: int, steps: int, run_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """The Hydra overrides of one measurement: ``posenc-lab train``'s config at model ``preset``, run for the window
    plus one step, with periodic validation, checkpoints and the sanity check out of it; then ``extra``."""
    total = warmup + steps + 1
    return [
        f"model={preset}",
        f"run_dir={run_dir}",
        f"trainer.max_steps={total}",
        f"trainer.val_check_interval={total + 1}",
        f"checkpoint_every={total + 1}",
        "trainer.num_sanity_val_steps=0",
        *extra,
    ]


@contextlib.contextmanager
def _quiet():
    """Lightning's info lines and the progress bar (stdout) out of the benchmark's output."""
    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        try:
            for lg in loggers:
                lg.setLevel(logging.WARNING)
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _build(cfg):
    """(datamodule, LitLM) as ``train.train`` builds them, seeded alike."""
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build_datamodule(cfg.data)
    lit = build_lit(cfg, datamodule)
    if cfg.get("compile", False):
        lit.model.compile()
    return datamodule, lit


def time_fit(cfg, warmup: int, steps: int, keep_losses: bool = False, profiler: cProfile.Profile | None = None):
    """Seconds per step (wall, process CPU) of ``Trainer.fit`` over the window, and the clock (its losses)."""
    datamodule, lit = _build(cfg)
    clock = StepClock(warmup, steps, keep_losses, profiler)
    with _quiet():
        trainer = build_trainer(cfg, Path(cfg.run_dir))
        if isinstance(trainer.checkpoint_callback, Checkpointing):
            trainer.checkpoint_callback.stop_signals = stop_signals()
        trainer.callbacks.append(clock)
        trainer.fit(lit, datamodule=datamodule)
    (w0, c0), (w1, c1) = clock.marks
    return (w1 - w0) / steps, (c1 - c0) / steps, clock


def time_bare(cfg, warmup: int, steps: int, device: torch.device, keep_losses: bool = False, window=None):
    """Seconds per step (wall, process CPU) of the bare loop (module doc) over the window, and its losses.
    ``window``: a context manager entered around the timed steps only (e.g. ``torch.profiler.profile``)."""
    datamodule, lit = _build(cfg)
    datamodule.setup("fit")
    stream = iter(datamodule.streams["train"])
    batches = [{k: v.to(device) for k, v in next(stream).items()} for _ in range(warmup + steps)]
    model = lit.model.to(device).train()
    plan = optimizer.schedule({**lit.optim, "total_steps": lit.optim.get("total_steps") or cfg.trainer.max_steps}, None)
    clip, precision = cfg.trainer.get("gradient_clip_val"), str(cfg.trainer.precision)
    as_fit = SimpleNamespace(precision=precision, gradient_clip_val=clip)  # the AdamW kernel the fit takes
    configured = optimizer.configure(model, lit.optim, as_fit, plan)
    opt, sched = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    params = [p for p in model.parameters() if p.requires_grad]
    memory, losses = Recurrence(), []

    def step(batch: dict) -> None:
        kw = {"reset": batch["reset"], "offset": batch["offset"], "loss_mask": batch["loss_mask"]}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            out = memory.step(model, batch["tokens"], batch["targets"], **kw)
        out.loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if keep_losses:
            losses.append(out.loss.detach())

    for batch in batches[:warmup]:
        step(batch)
    _sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    with window if window is not None else contextlib.nullcontext():
        for batch in batches[warmup:]:
            step(batch)
        _sync(device)
    w1, c1 = time.perf_counter(), time.process_time()
    return (w1 - w0) / steps, (c1 - c0) / steps, losses


def measure(preset: str, warmup: int, steps: int, extra: Sequence[str] = (), order=("bare", "fit"), profiler=None):
    """One round at one preset: a row with bare and fit ms/step (wall and CPU), their difference and tokens/s."""
    with tempfile.TemporaryDirectory(prefix="posenc_overhead_") as tmp:
        cfg = compose("train", overrides(preset, warmup, steps, str(Path(tmp) / "run"), extra))
        device = torch.device("cuda" if cfg.trainer.accelerator in ("gpu", "cuda") else "cpu")
        times = {}
        for loop in order:
            if loop == "bare":
                times[loop] = time_bare(cfg, warmup, steps, device)[:2]
            else:
                times[loop] = time_fit(cfg, warmup, steps, profiler=profiler)[:2]
    tokens = int(cfg.data.batch_size) * int(cfg.data.segment_len)
    (bare, bare_cpu), (fit, fit_cpu) = times["bare"], times["fit"]
    return {
        "config": preset,
        "scheme": cfg.posenc.name,
        "tokens_per_step": tokens,
        "bare_ms": bare * 1e3,
        "fit_ms": fit * 1e3,
        "overhead_ms": (fit - bare) * 1e3,
        "overhead_frac": (fit - bare) / fit,
        "bare_cpu_ms": bare_cpu * 1e3,
        "fit_cpu_ms": fit_cpu * 1e3,
        "overhead_cpu_ms": (fit_cpu - bare_cpu) * 1e3,
        "bare_tok_s": tokens / bare,
        "fit_tok_s": tokens / fit,
    }


PRECISIONS = ("32-true", "32", "bf16-mixed")  # what the bare loop reproduces (autocast; no gradient scaler)
SPREAD = ("overhead_ms", "overhead_cpu_ms", "overhead_frac")


def combine(rows: list[dict]) -> list[dict]:
    """One row per config from the rows of every round: each number the median over the rounds, and for the
    overhead (each round's own difference, paired) its lowest and highest round, ``<figure>_min`` / ``_max``."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config]
        row = {"rounds": len(mine)}
        for k, v in mine[0].items():
            if not isinstance(v, float):
                row[k] = v
                continue
            values = [r[k] for r in mine]
            row[k] = statistics.median(values)
            if k in SPREAD:
                row[k + "_min"], row[k + "_max"] = min(values), max(values)
        out.append(row)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="posenc-lab bench overhead",
        description="What a training step of `posenc-lab train` costs beyond the model's forward, backward and "
        "optimizer step (posenc_lab/bench/overhead.py).",
    )
    p.add_argument("--configs", default="tiny,small", help="comma-separated model presets (default: tiny,small)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, odd ones in the other order")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--steps", type=int, default=40, help="timed steps (a multiple of trainer.log_every_n_steps)")
    p.add_argument("--profile", action="store_true", help="cProfile the fit window of the last round")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of posenc-lab train (posenc=rope data.batch_size=8)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    presets = [c.strip() for c in args.configs.split(",") if c.strip()]
    problems = [f"--configs {c} (valid: {', '.join(model_presets())})" for c in presets if c not in model_presets()]
    problems += [f"--{k} {getattr(args, k)} (at least {low})" for k, low in (("rounds", 1), ("warmup", 1), ("steps", 1))
                 if getattr(args, k) < low]  # fmt: skip
    problems += [f"{o!r} (model is --configs)" for o in args.overrides if o.split("=")[0] in ("model", "+model")]
    if not problems and (problem := override_problem("train", args.overrides, "train")):
        problems.append(problem)
    for preset in presets if not problems else ():  # the values, as posenc-lab train checks them, before any step
        cfg = compose("train", overrides(preset, args.warmup, args.steps, "unused", args.overrides))
        problems += [p for p in check_problems(cfg, "train") if p not in problems]
        if str(cfg.trainer.precision) not in PRECISIONS and not any("precision" in p for p in problems):
            problems.append(f"trainer.precision={cfg.trainer.precision}: the bare loop runs {' or '.join(PRECISIONS)}")
    if problems:
        print(f"posenc-lab bench overhead: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    print(environment_line())
    rows, profiler = [], None
    for n in range(args.rounds):
        print(f"round {n + 1}/{args.rounds}", flush=True)
        for preset in presets if n % 2 == 0 else presets[::-1]:
            profiler = cProfile.Profile() if args.profile and n == args.rounds - 1 else None
            order = ("bare", "fit") if n % 2 == 0 else ("fit", "bare")
            row = measure(preset, args.warmup, args.steps, args.overrides, order, profiler)
            rows.append(row)
            print(text_row(row), flush=True)
            if profiler is not None:
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                print(f"\nprofile of the fit window, {preset} (by own time):\n{text.getvalue()}")
    print()
    print(text_table(combine(rows)))
    return 0
