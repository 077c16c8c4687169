"""The sweep table: ``sweep.csv`` (tidy: one row per trial), ``sweep.md`` and ``sweep.png`` under --out.

A row: trial, number, state (finished | stopped | failed | interrupted | running), one column per swept
parameter, metric (its name), value (the final metric), steps, validations, run_dir, error. The best trial is
the best value among finished and stopped trials; where trials repeat a setting with other seeds (equal
parameters but for ``seed``), ``seed_mean_interval`` gives the mean and a t-interval over those seeds of the final
metric. The figure: the metric against each swept parameter, one panel each (seaborn).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from posenc_lab_analysis.settings import conf_block
from posenc_lab_analysis.stats import mean_interval

from ..io import write_text, write_with

if TYPE_CHECKING:
    from .state import SweepState

CSV, MD, FIGURE = "sweep.csv", "sweep.md", "sweep.png"
SEED = "seed"


def level() -> float:
    """The project's one confidence level, ``ablate.analysis.level`` as the analysis' settings read it (the report's
    too: ``settings.conf_block``, the one reader of conf/ablate.yaml's analysis block)."""
    return float(conf_block("level"))


def seed_mean_interval(values: list[float], level: float) -> tuple[float, float, float]:
    """(mean, low, high) over seeds of the final metric, by the project's one estimator,
    ``posenc_lab_analysis.stats.mean_interval``; with one seed the interval is NaN. A final metric is one number
    per seed, not per-token values in units: given as two identical units, every unit residual of the text part is
    0, so the interval is the seed part alone, var_s / n with n - 1 degrees of freedom: Student's t over seeds."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    per_seed = np.repeat(np.asarray(values, dtype=np.float64)[:, None], 2, axis=1)  # [n_seeds, 2 units]
    d = mean_interval(per_seed, np.array([0, 1]), level)
    return d.estimate, d.low, d.high


def sweep_frame(state: SweepState) -> pd.DataFrame:
    """The tidy table of the sweep's trials."""
    metric = state.data["sweep"]["metric"]["name"]
    names = list(state.data["sweep"]["parameters"])
    rows = []
    for t in state.trials:
        row: dict[str, Any] = {"trial": t["id"], "number": t["number"], "state": t["state"]}
        row.update({n: t["params"].get(n) for n in names})
        row.update(
            metric=metric,
            value=t.get("metric"),
            steps=t.get("steps"),
            validations=len(t.get("history") or []),
            run_dir=t.get("run_dir"),
            error=t.get("error"),
        )
        rows.append(row)
    columns = ["trial", "number", "state", *names, "metric", "value", "steps", "validations", "run_dir", "error"]
    return pd.DataFrame(rows, columns=columns)


def best(frame: pd.DataFrame, goal: str) -> pd.Series | None:
    scored = frame[frame["state"].isin(["finished", "stopped"]) & frame["value"].notna()]
    if scored.empty:
        return None
    index = scored["value"].idxmax() if goal == "maximize" else scored["value"].idxmin()
    return scored.loc[index]


def seed_groups(frame: pd.DataFrame, names: list[str]) -> list[dict[str, Any]]:
    """Settings that ran with two or more seeds: {setting, n, mean, low, high}."""
    keys = [n for n in names if n != SEED]
    scored = frame[frame["state"].isin(["finished", "stopped"]) & frame["value"].notna()]
    if not keys or scored.empty:
        return []
    out = []
    for setting, group in scored.groupby([scored[k].astype(str) for k in keys], sort=False):
        if len(group) < 2:
            continue
        setting = setting if isinstance(setting, tuple) else (setting,)
        mean, low, high = seed_mean_interval(group["value"].astype(float).tolist(), level())
        out.append({"setting": dict(zip(keys, setting)), "n": len(group), "mean": mean, "low": low, "high": high})
    return out


def _fmt(value: Any) -> str:
    """A parameter value for reading: floats to 4 significant digits (sweep.csv keeps them whole)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown(state: SweepState, frame: pd.DataFrame, figure: bool) -> str:
    spec = state.data["sweep"]
    metric, goal = spec["metric"]["name"], spec["metric"].get("goal", "minimize")
    names = list(spec["parameters"])
    counts = frame["state"].value_counts().to_dict()
    lines = [
        f"# Sweep {spec.get('name') or ''} ({state.sweep_id})",
        "",
        f"- file: `{state.data['sweep_file']}`; method: {spec['method']}; metric: `{metric}` ({goal})",
        f"- overrides: `{' '.join(state.data['overrides']) or '(none)'}`",
        f"- trials: {len(frame)} ({', '.join(f'{n} {s}' for s, n in counts.items())})",
        "",
    ]
    top = best(frame, goal)
    groups = seed_groups(frame, names)
    if top is not None:
        setting = " ".join(f"{n}={_fmt(top[n])}" for n in names)
        line = f"**Best trial** `{top['trial']}`: {metric} = {top['value']:.4g} with {setting} (`{top['run_dir']}`)"
        for g in groups:
            if all(str(top[k]) == v for k, v in g["setting"].items()):
                line += (
                    f"; over its {g['n']} seeds: mean {g['mean']:.4g}, {level():.0%} t-interval over seeds of the "
                    f"final metric [{g['low']:.4g}, {g['high']:.4g}]"
                )
        lines += [line, ""]
    if groups:
        lines += [f"## Settings with repeated seeds (mean and {level():.0%} t-interval of the final metric)", ""]
        lines += ["| setting | seeds | mean | interval |", "|---|---|---|---|"]
        for g in groups:
            setting = " ".join(f"{k}={v}" for k, v in g["setting"].items())
            lines += [f"| {setting} | {g['n']} | {g['mean']:.4g} | [{g['low']:.4g}, {g['high']:.4g}] |"]
        lines += [""]
    lines += ["## Trials", "", "| trial | state | " + " | ".join(names) + f" | {metric} | steps | run dir |"]
    lines += ["|---" * (len(names) + 5) + "|"]
    for _, r in frame.iterrows():
        value = f"{r['value']:.4g}" if pd.notna(r["value"]) else (r["error"] or "")
        steps = "" if pd.isna(r["steps"]) else int(r["steps"])
        cells = [r["trial"], r["state"], *[_fmt(r[n]) for n in names], value, steps, r["run_dir"] or ""]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"]
    if figure:
        lines += ["", f"![{metric} against each parameter]({FIGURE})"]
    return "\n".join(lines) + "\n"


STATE_COLOURS = {"finished": "tab:blue", "stopped": "tab:orange", "interrupted": "tab:gray", "running": "tab:green"}


def plot(frame: pd.DataFrame, parameters: dict[str, Any], metric: str, path) -> None:
    """The metric against each swept parameter (``parameters``: the sweep file's), one panel each; colour: the
    trial's state; a log axis for a parameter drawn from a log distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    scored = frame[frame["value"].notna()].copy()
    names = list(parameters)
    palette = {s: c for s, c in STATE_COLOURS.items() if s in set(scored["state"])}
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        numeric = pd.to_numeric(scored[name], errors="coerce")
        common = dict(y="value", hue="state", palette=palette, hue_order=list(palette), ax=ax, legend=ax is axes[0][0])
        if numeric.notna().all() and numeric.nunique() > 1:
            sns.scatterplot(data=scored.assign(**{name: numeric}), x=name, **common)
            if "log" in str((parameters[name] or {}).get("distribution", "")):
                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # labelled ticks within a decade too
                ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            shown = set(scored[name].astype(str))
            order = [str(v) for v in (parameters[name] or {}).get("values", []) if str(v) in shown]
            order += sorted(shown - set(order))
            data = scored.assign(**{name: scored[name].astype(str)})
            sns.stripplot(data=data, x=name, order=order, size=7, **common)
        ax.set_ylabel(metric)
    fig.tight_layout()
    write_with(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)


def write_table(state: SweepState, figure: bool = True) -> None:
    """sweep.csv and sweep.md (and with ``figure``, sweep.png once a trial has a metric) under the sweep's --out."""
    frame = sweep_frame(state)
    write_with(state.out / CSV, lambda p: frame.to_csv(p, index=False))
    drawn = figure and frame["value"].notna().any()
    if drawn:
        plot(frame, state.data["sweep"]["parameters"], state.data["sweep"]["metric"]["name"], state.out / FIGURE)
    write_text(state.out / MD, markdown(state, frame, drawn or (state.out / FIGURE).exists()))
