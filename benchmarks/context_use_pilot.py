"""use(d) of trained runs on the validation split, checkpoint by checkpoint: the pilots' measure for sizing a preset
whose memory model uses context past L + M, without a look at the test split.

    python benchmarks/context_use_pilot.py RUN_DIR [RUN_DIR ...] --out OUT.csv [--rows 64] [--distances 0 32 64 ...]

Each run (a ``posenc-lab train`` folder) is evaluated as the report's context_use section evaluates it
(``analysis.perturbation.perturbed``: rows of the split run as trained, the context beyond d replaced by a row of
another unit), at every checkpoint its folder keeps (``callbacks.checkpoint.save_top_k=-1`` keeps the periodic
ones: a learning curve of use(d)), on all scored tokens and on the long-range ones (``perturbation.long_range``).
One row of OUT.csv per (run, checkpoint, tokens, d): use(d) in bits per unit with its interval over the split's
units (one seed: the text's part alone), the true loss, and the context used. The split is ``val`` or ``train``:
never the test split, which judges the presets.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from posenc_lab.checkpoints import read_checkpoint
from posenc_lab.evaluate import load_model
from posenc_lab_analysis.perturbation import PerturbationSettings, long_range, perturbed, spec, use_table
from posenc_lab_analysis.runs import RunError, load_run
from posenc_lab_analysis.stats import mean_interval

LN2 = float(np.log(2))


def checkpoints(run_dir: Path, which: str) -> list[tuple[int, Path]]:
    """(step, path) of the run's periodic checkpoints and its last one, in step order (``which`` "last": that alone)."""
    last = run_dir / "checkpoints" / "last.ckpt"
    found = {}
    if which == "all":
        for p in (run_dir / "checkpoints").glob("step*.ckpt"):
            found[int(re.sub(r"\D", "", p.stem))] = p
    step = int(read_checkpoint(last)["global_step"])
    found[step] = last
    return sorted(found.items())


def score(run_dir: Path, args) -> pd.DataFrame:
    run = load_run(run_dir)
    settings = PerturbationSettings(args.rows, args.distances, args.ngram, args.batch_tokens)
    s = spec(settings, [run], args.split)
    span = run.segment_len + run.mem_len
    rows = []
    for step, ckpt in checkpoints(run_dir, args.checkpoints):
        t0, c0 = time.time(), time.process_time()
        run._cache["model"] = load_model(ckpt).eval()
        dump = perturbed(run, s, args.cache / f"{run.name}_step{step}.npz", log=lambda m: print(m, file=sys.stderr))
        corpus = run.corpus()
        far = long_range(corpus.split(args.split), corpus.documents(args.split), dump.targets, span, args.ngram)[
            dump.scored
        ]
        units, use, true = dump.units[dump.scored], dump.use()[None], dump.true[dump.scored][None]
        for name, keep in (("all", np.ones_like(far)), ("long_range", far)):
            if len(np.unique(units[keep])) < 2:
                continue
            curves, used = use_table(
                {run.name: use[..., keep]}, dump.distances, units[keep], args.level, {run.name: [run.seed]}, args.n_boot
            )
            loss = mean_interval(true[:, keep], units[keep], args.level)
            u = used.iloc[0]
            for _, c in curves.iterrows():
                rows.append(
                    {
                        "run": run.name,
                        "step": step,
                        "tokens": name,
                        "n_tokens": int(keep.sum()),
                        "n_units": len(np.unique(units[keep])),
                        "L": run.segment_len,
                        "M": run.mem_len,
                        "d": int(c["d"]),
                        "d_over_span": c["d"] / span,
                        "use_bits": c["use"] / LN2,
                        "low_bits": c["low"] / LN2,
                        "high_bits": c["high"] / LN2,
                        "true_loss_bits": loss.estimate / LN2,
                        "context_used": u["context_used"],
                        "used_low": u["used_low"],
                        "used_high": u["used_high"],
                    }
                )
        print(
            f"{run.name} step {step}: scored in {time.time() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU",
            file=sys.stderr,
        )
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the CSV written (one row per run, step, tokens, d)")
    p.add_argument("--split", choices=["val", "train"], default="val")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--distances", type=int, nargs="+", default=None, help="the d (default: the report's grid)")
    p.add_argument("--ngram", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=65536)
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--n-boot", type=int, default=100)
    p.add_argument("--checkpoints", choices=["all", "last"], default="all")
    p.add_argument("--cache", type=Path, default=None, help="where the dumps are kept (default: beside --out)")
    args = p.parse_args(argv)
    if not 0 < args.level < 1:
        p.error(f"--level must be in (0, 1), got {args.level}")
    args.cache = args.cache or args.out.parent / "dumps"
    args.cache.mkdir(parents=True, exist_ok=True)
    try:
        PerturbationSettings(args.rows, args.distances, args.ngram, args.batch_tokens)  # bad settings: one line
        frames = [score(r, args) for r in args.runs]
    except (ValueError, RunError) as e:
        p.error(str(e))
    out = pd.concat(frames)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False, float_format="%.5f")
    span = out["L"] + out["M"]
    show = out[out["d"].isin([0, *sorted(set(span))])]
    print(
        show[
            [
                "run",
                "step",
                "tokens",
                "n_tokens",
                "d",
                "use_bits",
                "low_bits",
                "high_bits",
                "true_loss_bits",
                "context_used",
            ]
        ].to_string(index=False)
    )


if __name__ == "__main__":
    main()
