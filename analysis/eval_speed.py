"""Evaluation speed: tokens/s with memory reuse against recomputing a sliding window, at several
attention lengths A (Transformer-XL Table 9: 363x at A = 800 up to 1,874x at A = 3,800 on a GPU).

- memory reuse: segments of L tokens, memory M' = A with the same-length mask: every token sees
  exactly A previous tokens, and a forward pass predicts L tokens.
- sliding window: the vanilla evaluation; every predicted token gets a fresh window of its A
  previous tokens, recomputed from scratch: a forward pass of A + 1 tokens predicts one token.

Both run B parallel streams and give the same context to every token; weights do not matter for
speed, so a fresh model of the given size (or a run's) is timed, by the benchmark's
``posenc_lab.bench.measure_eval_speed`` (median of 3 calls).

    python -m posenc_lab_analysis.eval_speed --out DIR --attn-lens 64,128,256,512 [--posenc NAME --d-model 128 ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from posenc_lab.bench import measure_eval_speed
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.tables import write_csv

from . import plots
from .runs import add_threads_argument, apply_threads, load_run
from .settings import conf_block, structured
from .verdicts import paper


@dataclass
class SpeedSettings:
    """``ablate.analysis.speed`` (its values: conf/ablate.yaml)."""

    attn_lens: list[int]  # attention lengths A
    batch: int  # parallel streams
    reps: int  # timed calls per point (the median is kept)


def measure(model, attn_len: int, segment_len: int, batch: int, reps: int) -> list[dict]:
    """Tokens/s of both methods at one attention length, timed by ``posenc_lab.bench.measure_eval_speed``
    (median of ``reps``): rows of method, attn_len, tokens_per_s, seconds, ..."""
    r = measure_eval_speed(model=model, attention_len=attn_len, segment_len=segment_len, batch_size=batch, reps=reps)
    common = {"attn_len": attn_len, "batch": batch, "calls": reps, "timer": "posenc_lab.bench"}
    return [
        {
            "method": "memory",
            "segment_len": segment_len,
            "tokens_per_s": r["memory_tok_s"],
            "seconds": r["memory_ms_per_segment"] / 1e3,
            **common,
        },
        {
            "method": "sliding window",
            "segment_len": attn_len + 1,
            "tokens_per_s": r["window_tok_s"],
            "seconds": r["window_ms_per_window"] / 1e3,
            **common,
        },
    ]


def analyze(model, s: SpeedSettings, out: Path, segment_len: int, log=print) -> tuple[pd.DataFrame, dict[str, Path]]:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for A in s.attn_lens:
        log(f"  eval speed: attention length {A}")
        rows += measure(model, A, segment_len, s.batch, s.reps)
    df = pd.DataFrame(rows)
    df["ms_per_token"] = 1000 / df["tokens_per_s"]
    wide = df.pivot_table(index="attn_len", columns="method", values="tokens_per_s")
    df["speedup"] = df["attn_len"].map(wide["memory"] / wide["sliding window"])
    df["scheme"] = model.cfg.posenc
    df["threads"] = torch.get_num_threads()
    write_csv(df, out / "eval_speed.csv")
    return df, {"eval_speed": plots.eval_speed(df, out / "eval_speed.png")}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.eval_speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--run", type=Path, help="time this run's model (default: a fresh model of the sizes below)")
    d = structured(SpeedSettings, conf_block("speed"), "ablate.analysis.speed")
    p.add_argument("--attn-lens", default=",".join(map(str, d.attn_lens)), help="comma-separated attention lengths")
    p.add_argument("--segment-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--reps", type=int, default=d.reps, help="timed calls per point (the median is kept)")
    p.add_argument(
        "--posenc", default=None, help="scheme of the fresh model (default: the paper's XL encoding, conf/paper.yaml)"
    )
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    add_threads_argument(p)
    a = p.parse_args(argv)
    if a.posenc is None:
        a.posenc = paper()["proposed"]
    apply_threads(a.threads)
    if a.run:
        model = load_run(a.run).model()
    else:
        model = MemoryTransformer(
            ModelConfig(
                n_layer=a.n_layer,
                d_model=a.d_model,
                n_head=a.n_head,
                d_inner=4 * a.d_model,
                posenc=a.posenc,
                dropout=0.0,
            )
        ).eval()
    try:
        s = SpeedSettings([int(x) for x in a.attn_lens.split(",")], a.batch, a.reps)
        df, _ = analyze(model, s, a.out, a.segment_len)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(df[["method", "attn_len", "tokens_per_s", "speedup"]].to_string(index=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
