"""bf16-mixed against fp32: training loss curves on real text, the same data order for every run.

Each (precision, seed) run initialises the weights from its seed and trains on the same batches (the
corpus's train split, ordered streams, memory carried, AdamW); a second fp32 seed measures the
run-to-run noise that the bf16-mixed gap is compared with. Memory is carried by ``posenc_lab.model.Recurrence``,
the one loop step of training and the analyses. The model is a preset of conf/model/ with
optional field overrides, as in ``posenc-lab bench``.

    python -m posenc_lab_analysis.loss_curve --steps 300 --model small --model-set n_layer=2,mem_len=64 \\
        --segment-len 64 --batch 8 --out DIR      # loss_curve.{csv,md} and loss_curve_steps.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from posenc_lab.bench import BenchConfig, autocast, environment_line, make_optimizer, pick_device
from posenc_lab.bench.cli import parse_assignments
from posenc_lab.data import load_corpus
from posenc_lab.model import MemoryTransformer, ModelConfig, Recurrence
from posenc_lab.tables import text_table, write_csv, write_table

from .runs import add_threads_argument, apply_threads

RUNS = (("fp32", 0), ("bf16-mixed", 0), ("fp32", 1))


def loss_curves(
    bench_cfg: BenchConfig | str = "tiny",
    scheme: str | None = None,
    steps: int = 300,
    runs: Sequence[tuple[str, int]] = RUNS,
    lr: float = 1e-3,
    corpus: str = "pystdlib",
    max_bytes: int = 2_000_000,
    device: str | torch.device | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Training loss per step of each (precision, seed) run. Returns {"runs": {"fp32/seed0": [losses], ...},
    "steps", "config", "scheme"}; ``scheme`` defaults to ModelConfig's."""

    bc = BenchConfig.preset(bench_cfg) if isinstance(bench_cfg, str) else bench_cfg
    scheme = scheme or ModelConfig.posenc
    device = pick_device(None if device is None else str(device))
    data = load_corpus(corpus, max_bytes=max_bytes)
    curves = {}
    for precision, seed in runs:
        torch.manual_seed(seed)
        model = MemoryTransformer(bc.model_config(scheme, memory=bc.mem_len > 0)).to(device).train()
        opt = make_optimizer(model, lr)
        stream = iter(data.stream("train", bc.segment_len, bc.batch_size))
        memory, losses = Recurrence(), []  # the memory carried from segment to segment, as in training
        for step in range(steps):
            try:
                batch = next(stream)
            except StopIteration:  # the split read once: start it again, with no memory
                stream = iter(data.stream("train", bc.segment_len, bc.batch_size))
                memory.clear()
                batch = next(stream)
            with autocast(device, precision):
                out = memory.step(
                    model,
                    batch["tokens"].to(device),
                    batch["targets"].to(device),
                    reset=bool(batch["reset"]),
                    offset=batch["offset"].to(device),
                )
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
            if log and (step + 1) % 50 == 0:
                log(f"{precision} seed {seed}: step {step + 1} loss {statistics.fmean(losses[-50:]):.4f}")
        curves[f"{precision}/seed{seed}"] = losses
    return {"runs": curves, "steps": steps, "config": bc.name, "scheme": scheme}


def summarize_curves(curves: dict, window: int = 50) -> list[dict]:
    """Mean loss over the last ``window`` steps per run, its gap to the first run, and the mean absolute
    step-by-step difference to the first run."""
    runs = curves["runs"]
    ref = next(iter(runs.values()))
    rows = []
    for name, c in runs.items():
        rows.append(
            {
                "run": name,
                "final_loss": statistics.fmean(c[-window:]),
                "gap_to_first": statistics.fmean(c[-window:]) - statistics.fmean(ref[-window:]),
                "mean_abs_step_diff": statistics.fmean(abs(a - b) for a, b in zip(c, ref)),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.loss_curve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--model", default="tiny", help="model preset of conf/model/ (default: tiny)")
    p.add_argument("--model-set", type=parse_assignments, default={}, metavar="K=V,...", help="override preset fields")
    p.add_argument("--segment-len", type=int, default=None, help="default: the preset's mem_len")
    p.add_argument("--batch", type=int, default=None, help="default: 2048 tokens per step")
    p.add_argument("--scheme", default=None, help="positional scheme (default: ModelConfig's)")
    p.add_argument("--corpus", default="pystdlib")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None)
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    bc = BenchConfig.preset(a.model, a.segment_len, a.batch, **a.model_set)
    env = environment_line()
    print(env)
    curves = loss_curves(
        bc, a.scheme, a.steps, corpus=a.corpus, device=a.device, log=lambda line: print(line, flush=True)
    )
    rows = summarize_curves(curves)
    print(text_table(rows))
    if a.out:
        command = "python -m posenc_lab_analysis.loss_curve " + " ".join(sys.argv[1:] if argv is None else argv)
        write_table(rows, a.out / "loss_curve", f"{env}\n\n`{command}`")
        per_step = [{"step": i + 1, **{k: v[i] for k, v in curves["runs"].items()}} for i in range(curves["steps"])]
        write_csv(per_step, a.out / "loss_curve_steps.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
