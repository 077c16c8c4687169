"""The compile table and figure from the benchmark's per-round CSVs (compile_every_scheme.sh wrote them into OUT).

    python benchmarks/compile_summary.py OUT

Round 1 ran on an empty inductor cache (cold: what a first run on a machine pays), round 2 on the cache round 1
left (warm: a second run). Step times: compiled over eager within each round; the table gives both rounds."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd
import seaborn as sns

from posenc_lab.tables import markdown_table

CONFIGS = ["tiny", "small", "base"]


def rounds(folder: Path) -> pd.DataFrame:
    """One row per (config, scheme, round, compile) with its figures."""
    frames = []
    for config in CONFIGS:
        for n in (1, 2):
            path = folder / config / f"bench_round{n}.csv"
            if path.exists():
                frames.append(pd.read_csv(path).assign(round=n))
    return pd.concat(frames, ignore_index=True)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (config, scheme): eager and compiled ms (median of the rounds), compiled/eager per round, compile s and
    the 1,000-step ratio cold (round 1) and warm (round 2)."""
    key = ["config", "scheme", "round"]
    eager = df[~df["compile"]].set_index(key)
    comp = df[df["compile"]].set_index(key)
    per = pd.DataFrame(
        {
            "eager_ms": eager["train_ms"],
            "compiled_ms": comp["train_ms"],
            "step_ratio": comp["train_ms"] / eager["train_ms"],
            "compile_s": comp["compile_s"],
            "eval_compile_s": comp["eval_compile_s"],
            "run_1000_ratio": comp["train_1000_ratio"],
        }
    ).reset_index()
    wide = per.pivot_table(index=["config", "scheme"], columns="round", aggfunc="first")
    out = pd.DataFrame(
        {
            "eager ms": wide["eager_ms"].median(axis=1),
            "compiled ms": wide["compiled_ms"].median(axis=1),
            "compiled/eager r1": wide["step_ratio"][1],
            "compiled/eager r2": wide["step_ratio"].get(2),
            "compile s cold": wide["compile_s"][1],
            "compile s warm": wide["compile_s"].get(2),
            "eval compile s cold": wide["eval_compile_s"][1],
            "eval compile s warm": wide["eval_compile_s"].get(2),
            "1,000 steps cold": wide["run_1000_ratio"][1],
            "1,000 steps warm": wide["run_1000_ratio"].get(2),
        }
    )
    out = out.reset_index()
    out["config"] = pd.Categorical(out["config"], CONFIGS, ordered=True)
    return out.sort_values(["config", "scheme"]).reset_index(drop=True)


def figure(t: pd.DataFrame, path: Path) -> None:
    """The 1,000-step ratio per scheme, a panel per config, cold and warm: below 1 compiling pays."""
    long = t.melt(id_vars=["config", "scheme"], value_vars=["1,000 steps cold", "1,000 steps warm"],
                  var_name="inductor cache", value_name="1,000-step run, compiled / eager")  # fmt: skip
    long["inductor cache"] = long["inductor cache"].str.replace("1,000 steps ", "")
    grid = sns.catplot(data=long, x="1,000-step run, compiled / eager", y="scheme", hue="inductor cache",
                       col="config", kind="point", linestyles="none", height=6, aspect=0.6)  # fmt: skip
    for ax in grid.axes.flat:  # log scale: path's 2-5x beside the others' 0.7-1.7
        ax.set_xscale("log")
        ax.set_xticks([0.7, 1, 1.5, 2, 3, 5], labels=["0.7", "1", "1.5", "2", "3", "5"])
        ax.minorticks_off()
        ax.axvline(1.0, color="grey", lw=0.8)
    grid.figure.suptitle(
        "torch.compile on a 2-core EPYC, fp32 with memory: below 1 it pays in a 1,000-step run", y=1.02
    )
    grid.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    t = table(rounds(folder))
    t.to_csv(folder / "compile_table.csv", index=False)
    (folder / "compile_table.md").write_text(
        markdown_table(t.astype({"config": str}).to_dict("records"), default=2) + "\n"
    )
    figure(t, folder / "compile_1000.png")
    print(t.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
