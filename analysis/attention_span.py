"""Attention span: how much attention mass each scheme, layer and head puts at each distance
``d = i - j``, memory included (where the model looks).

Every run is evaluated as trained (segment L, memory M): after enough segments to fill the
memory, the attention probabilities of the next ``n_segments`` segments (``ModelOutput.attention``,
``return_attention=True``) are averaged over streams and queries. ``mass(layer, head, d)`` is the
mean over queries of the probability on the key at distance d (so it sums to 1 over d).

    python -m posenc_lab_analysis.attention_span RUN_OR_FOLDER... --out DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from posenc_lab.context import iter_stream, stream_rows
from posenc_lab.tables import write_csv

from . import plots
from .runs import Run, RunError, add_threads_argument, apply_threads, find_runs
from .settings import conf_block, structured


@dataclass
class AttentionSettings:
    """``ablate.analysis.attention`` (its values: conf/ablate.yaml)."""

    n_rows: int  # streams
    n_segments: int  # segments measured per stream, after the memory is full


def attention_mass(run: Run, s: AttentionSettings, split: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mass: run, layer, head, distance, mass; heads: run, layer, head, mean_distance, memory_share,
    first_key_share, sink_share, beyond_L_share) of one run. first_key_share: the mass on the oldest key each query
    sees (the memory's first slot; without memory the segment's first token), where a model without a sink piles
    what it cannot place; sink_share: the mass a learned sink (``model.attention_sink``) takes, 1 - sum_j p_ij."""
    L, M = run.segment_len, run.mem_len
    warm = -(-M // L) * L  # whole segments until the memory holds M states
    data, _ = run.split(split)
    rows = stream_rows(data, s.n_rows, warm + s.n_segments * L)
    model = run.model()
    n_layer, H = model.cfg.n_layer, model.cfg.n_head
    D = M + L  # distances 0..M+L-1
    mass = torch.zeros(n_layer, H, D, dtype=torch.float64)
    memory_share = torch.zeros(n_layer, H, dtype=torch.float64)
    first_key_share = torch.zeros(n_layer, H, dtype=torch.float64)
    sink_share = torch.zeros(n_layer, H, dtype=torch.float64)
    n_seg = 0
    for start, _, out in iter_stream(model, rows, segment_len=L, mem_len=M, return_attention=True):
        if start < warm:
            continue
        n_seg += 1
        for layer, probs in enumerate(out.attention):  # [B, H, L, N]
            p = probs.double().mean(0).cpu()  # [H, L, N]
            Lq, N = p.shape[-2:]
            m_cur = N - Lq
            dist = torch.arange(Lq)[:, None] + m_cur - torch.arange(N)[None, :]  # [L, N] = i - j
            valid = dist >= 0
            flat = dist.clamp(min=0).flatten()
            contrib = (p * valid).reshape(H, -1)
            mass[layer].scatter_add_(1, flat.expand(H, -1), contrib / Lq)
            memory_share[layer] += p[:, :, :m_cur].sum(-1).mean(-1)
            first_key_share[layer] += p[:, :, 0].mean(-1)
            sink_share[layer] += (1 - p.sum(-1)).clamp(min=0).mean(-1)
    mass /= max(n_seg, 1)
    memory_share /= max(n_seg, 1)
    first_key_share /= max(n_seg, 1)
    sink_share /= max(n_seg, 1)
    d = torch.arange(D, dtype=torch.float64)
    key = {**run.key, "label": run.label, "segment_len": L}
    mrows, hrows = [], []
    for layer in range(n_layer):
        for h in range(H):
            m = mass[layer, h].numpy()
            mrows += [{**key, "layer": layer, "head": h, "distance": int(k), "mass": float(v)} for k, v in enumerate(m)]
            hrows.append(
                {
                    **key,
                    "layer": layer,
                    "head": h,
                    "mean_distance": float((mass[layer, h] * d).sum()),
                    "memory_share": float(memory_share[layer, h]),
                    "first_key_share": float(first_key_share[layer, h]),
                    "sink_share": float(sink_share[layer, h]),
                    "beyond_L_share": float(mass[layer, h, L:].sum()),
                }
            )
    return pd.DataFrame(mrows), pd.DataFrame(hrows)


@dataclass
class AttentionResult:
    mass: pd.DataFrame
    heads: pd.DataFrame
    summary: pd.DataFrame
    figures: dict[str, Path] = field(default_factory=dict)


def analyze(runs: list[Run], out: Path, s: AttentionSettings, split: str, log=print) -> AttentionResult:
    out.mkdir(parents=True, exist_ok=True)
    masses, heads = [], []
    for i, run in enumerate(runs, 1):
        log(f"  attention [{i}/{len(runs)}] {run.label}")
        m, h = attention_mass(run, s, split)
        masses.append(m)
        heads.append(h)
    mass, heads = pd.concat(masses, ignore_index=True), pd.concat(heads, ignore_index=True)
    keys = ["run", "cell", "scheme", "mem_len", "loss"]
    summary = (
        heads.groupby(keys, sort=False)
        .agg(
            mean_distance=("mean_distance", "mean"),
            max_head_distance=("mean_distance", "max"),
            memory_share=("memory_share", "mean"),
            first_key_share=("first_key_share", "mean"),
            sink_share=("sink_share", "mean"),
            beyond_L_share=("beyond_L_share", "mean"),
        )
        .reset_index()
    )
    write_csv(mass, out / "attention_mass.csv")
    write_csv(heads, out / "attention_heads.csv")
    write_csv(summary, out / "attention_summary.csv")
    res = AttentionResult(mass, heads, summary)
    for loss in dict.fromkeys(mass["loss"]):
        part = mass[mass["loss"] == loss]
        name = "attention_heatmap.png" if loss == "full" else f"attention_heatmap_{loss.replace(' ', '_')}.png"
        res.figures[loss] = plots.attention_heatmaps(part, out / name)
    return res


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m posenc_lab_analysis.attention_span",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", required=True, type=Path)
    d = structured(AttentionSettings, conf_block("attention"), "ablate.analysis.attention")
    p.add_argument("--split", default=conf_block("split"), choices=("val", "test"))
    p.add_argument("--n-rows", type=int, default=d.n_rows)
    p.add_argument("--n-segments", type=int, default=d.n_segments)
    add_threads_argument(p)
    a = p.parse_args(argv)
    apply_threads(a.threads)
    try:
        res = analyze(find_runs(a.runs), a.out, AttentionSettings(a.n_rows, a.n_segments), a.split)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200):
        print(res.summary.to_string(index=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
