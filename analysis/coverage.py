"""Coverage of the report's intervals and the error rates of its verdicts, simulated at the variance components
measured on the default ablation (``variance.py``), for a layout of the test split: the one the default ablation
scores (``SPLIT``, measured with the components), the split before it was designed for inference (``BEFORE``: 42
scored files in 14 families, one of them 48% of the tokens) or a designed one (30 families, equal tokens each).

The simulated losses of cell c, seed s, on the tokens of file k in family g (nats):

    x[s, t] = f_c[g] + u_c[k] + alpha_cs + e_cst      Var f = rho tau^2 / 2, Var u = (1 - rho) tau^2 / 2,
                                                      Var alpha = sigma_c^2, Var(mean_k e) = kappa n_k^-gamma

so that a difference of two cells has file SD tau and intra-family correlation rho, as measured. Every cell
has the same mean (the global null). The estimator reads the tokens only through their sums per unit and
seed, so each file is simulated with one pseudo-token per ``TOKENS_PER_PSEUDO`` of its tokens, its noise
scaled to the file's.

``python -m posenc_lab_analysis.coverage [--reps N]``: the tables of analysis/README.md.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from posenc_lab.cellnames import CellName
from posenc_lab.tables import markdown_table

from .settings import conf_block
from .stats import paired_difference
from .variance import COMPONENTS_FILE
from .verdicts import CONTRADICTED, REPRODUCED, Evidence, judge, paper

TOKENS_PER_PSEUDO = 64
LEVEL = conf_block("level")  # the report's intervals' (ablate.analysis.level), whose coverage is simulated


@dataclass(frozen=True)
class Layout:
    """The scored files of a test split: tokens of each file, family of each file."""

    name: str
    file_tokens: tuple[int, ...]
    file_family: tuple[int, ...]

    def shares(self) -> np.ndarray:
        n = np.bincount(self.file_family, weights=self.file_tokens)
        return n / n.sum()


# The scored tokens of the default ablation before the test split was designed for inference (64 streams x 4,096
# of the old pystdlib test split), measured with ``python -m posenc_lab_analysis.variance`` on its dumps: 42 files,
# 14 families, the largest (asyncio) 48.4%: the corpus's own layout, kept as the case of a dominant unit.
BEFORE = Layout(
    "before the family split (14 families, largest 48%)",
    (1188, 2908, 15898, 486, 2710, 5482, 4096, 4096, 8192, 3725, 371, 8192, 8192, 8192, 4096, 4891, 791, 2510, 1173,
     11115, 8192, 4096, 4096, 4084, 12, 4096, 16384, 7505, 12975, 1602, 6590, 8192, 8192, 12288, 25964, 1, 2416, 8483,
     20480, 876, 3220, 4096),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 11, 12, 12,
     12, 12, 12, 12, 13),
)  # fmt: skip


def designed(families: int = 30, n_tokens: int = 262144, seed: int = 0) -> Layout:
    """A split designed for inference: ``families`` families of equal scored tokens, each in 1-3 files."""
    rng = np.random.default_rng(seed)
    tokens, family = [], []
    for g in range(families):
        cuts = rng.dirichlet(np.ones(int(rng.integers(1, 4))))
        sizes = np.maximum(1, np.round(cuts * n_tokens / families)).astype(int)
        tokens += sizes.tolist()
        family += [g] * len(sizes)
    return Layout(f"designed ({families} families, equal tokens)", tuple(tokens), tuple(family))


@dataclass(frozen=True)
class Components:
    """Measured components (nats): each cell's seed SD, token noise out (``seed_sd``, or ``default_seed_sd``), the
    file SD of a difference, its intra-family correlation, the token noise law of a file mean (kappa n^-gamma),
    and the median SD of a cell's seed means, token noise in (``power.plan_lines``)."""

    file_sd: float
    icc: float
    kappa: float
    gamma: float
    default_seed_sd: float
    seed_sd: dict[str, float] = field(default_factory=dict)
    seed_sd_of_means: float = float("nan")

    def of(self, cell: str) -> float:
        return self.seed_sd.get(cell, self.default_seed_sd)


# Measured on the default ablation's dumps (analysis/README.md, "Variance components"), written by
# ``python -m posenc_lab_analysis.variance DUMPS --components``: the components, each cell's seeds, the pair whose
# interval coverage() studies and the layout of the scored tokens. The figures (and the cells they name) are
# data: scheme names live in the registry, conf/ and the measurements, never in analysis/'s code.
_measured = json.loads(COMPONENTS_FILE.read_text())
MEASURED = Components(**_measured["components"])
SEEDS: dict[str, int] = _measured["seeds"]  # the simulated cells (the default ablation's) and their seeds
CELLS = tuple(SEEDS)
PAIR = tuple(_measured["coverage_pair"])
SPLIT = Layout(
    f"the default test split ({_measured['layout']['families']} families)",
    tuple(_measured["layout"]["file_tokens"]),
    tuple(_measured["layout"]["file_family"]),
)


def _key(name: str) -> CellName:
    return CellName.parse(name)


class Simulator:
    """Simulated per-token values of cells on one layout (module docstring)."""

    def __init__(self, layout: Layout, comps: Components):
        n_k = np.asarray(layout.file_tokens, dtype=float)
        m_k = np.maximum(1, np.round(n_k / TOKENS_PER_PSEUDO)).astype(int)
        self.file = np.repeat(np.arange(len(n_k)), m_k)
        self.family = np.asarray(layout.file_family)[self.file]
        self.G, self.K = int(self.family.max()) + 1, len(n_k)
        # a pseudo-token's noise variance, so that a file's mean has the noise of its n_k tokens
        self.noise_sd = np.sqrt(comps.kappa * n_k**-comps.gamma * m_k)[self.file]
        self.comps = comps

    def cell(
        self, rng, name: str, seeds: int | None = None, families: str = "normal", shared=None, seed_corr: float = 0.0
    ) -> np.ndarray:
        """[seeds, pseudo-tokens] of one cell at the null; seeds: the cell's in the default ablation (``SEEDS``),
        else 3. families: "normal" (the family effects above), "exponential" (skewed: Exp(1) - 1, mean 0, with the
        whole difference's family variance, rho tau^2, on this cell) or "none". shared: [>= seeds] standard
        normal seed draws shared by the cells of one ablation (seed s of every cell: ``seed_everything(s)``),
        correlated with this cell's seed effect at ``seed_corr``."""
        seeds = seeds or SEEDS.get(name, 3)
        c = self.comps
        if families == "exponential":
            f = (rng.exponential(1.0, self.G) - 1.0)[self.family] * np.sqrt(c.icc) * c.file_sd
        else:
            f = rng.normal(0, np.sqrt(c.icc / 2) * c.file_sd * (families == "normal"), self.G)[self.family]
        u = rng.normal(0, np.sqrt((1 - c.icc) / 2) * c.file_sd, self.K)[self.file]
        z = rng.normal(0, 1, (seeds, 1))
        if shared is not None:
            z = np.sqrt(seed_corr) * np.asarray(shared)[:seeds, None] + np.sqrt(1 - seed_corr) * z
        return f + u + c.of(name) * z + rng.normal(0, 1, (seeds, len(self.file))) * self.noise_sd


def coverage(
    layout: Layout,
    comps: Components,
    reps: int,
    seed: int = 0,
    units: str = "family",
    pair: tuple[str, str] = PAIR,
    seeds: tuple[int, int] | None = None,
    skewed: bool = False,
    seed_corr: float = 0.0,
) -> dict:
    """One difference (``pair``, each side its seeds, or ``seeds``) at the null: the coverage of its ``LEVEL`` interval,
    the share of intervals wholly below the truth (``below``) and above it, the rate at which a one-sided test at 5%
    rejects (either direction, each counted), the median df and the median width. skewed: the difference's
    family effects Exp(1) - 1 (on the first cell), not normal. seed_corr: seed s of one cell correlates with seed s
    of the other (``Simulator.cell``)."""
    rng = np.random.default_rng(seed)
    sim = Simulator(layout, comps)
    by = sim.family if units == "family" else sim.file
    n_a, n_b = seeds or (None, None)
    fam = ("exponential", "none") if skewed else ("normal", "normal")
    below, above, reject, dfs, widths = 0, 0, 0, [], []
    for _ in range(reps):
        shared = rng.normal(0, 1, 8)
        d = paired_difference(
            sim.cell(rng, pair[0], n_a, fam[0], shared, seed_corr),
            sim.cell(rng, pair[1], n_b, fam[1], shared, seed_corr),
            by,
            LEVEL,
        )
        below += d.high < 0
        above += d.low > 0
        reject += d.p_value("<0") < 0.05
        dfs.append(d.df)
        widths.append(d.high - d.low)
    return {
        "coverage": 1 - (below + above) / reps,
        "below": below / reps,
        "above": above / reps,
        "one_sided_5pct": reject / reps,
        "median_df": float(np.median(dfs)),
        "median_width": float(np.median(widths)),
    }


def error_rates(
    layout: Layout, comps: Components, reps: int, seed: int = 0, config: dict | None = None
) -> pd.DataFrame:
    """Every verdict of ``config`` (default: conf/paper.yaml) judged at the global null ``reps`` times through
    ``verdicts.judge``: the share of false "reproduced" and "contradicted", and of any false claim. The
    as-trained cells, their attention gains (memory cells), their context gains and their position gaps (every
    cell; a gap's per-token values, ``sections/position.gap_values``, are carried as any loss), each simulated
    with the same components, are simulated; recall_beyond is not (its units are the probe's own)."""
    config = config or paper()
    rng = np.random.default_rng(seed)
    sim = Simulator(layout, comps)
    keys = {c: _key(c) for c in CELLS}
    rows = {v["id"]: {"verdict": v["id"], "reproduced": 0, "contradicted": 0, "judged": 0} for v in config["verdicts"]}
    any_false = 0
    for _ in range(reps):
        trained = Evidence({c: sim.cell(rng, c) for c in CELLS}, keys, sim.family)
        memory = [c for c in CELLS if keys[c].memory]
        gain = Evidence({c: sim.cell(rng, c) for c in memory}, {c: keys[c] for c in memory}, sim.family)
        context = Evidence({c: sim.cell(rng, c) for c in CELLS}, keys, sim.family)  # the loss at 4 (L + M) - at L
        position = Evidence({c: sim.cell(rng, c) for c in CELLS}, keys, sim.family)  # each token's share of the gap
        measures = {"as_trained": trained, "attention_gain": gain, "context_gain": context, "position_gap": position}
        verdicts, _ = judge(config, measures)
        false = False
        for v in verdicts:
            row = rows[v.id]
            row["judged"] += np.isfinite(v.p)
            row["reproduced"] += v.status == REPRODUCED
            row["contradicted"] += v.status == CONTRADICTED
            false |= v.status in (REPRODUCED, CONTRADICTED)
        any_false += false
    df = pd.DataFrame(rows.values())
    for col in ("reproduced", "contradicted"):
        df[col] = df[col] / reps
    df["judged"] = df["judged"] / reps
    df.attrs["any_false"] = any_false / reps
    return df


def _pairs() -> dict[str, tuple[str, str]]:
    """The simulated differences of the measured design's rows, from the measured cells (no scheme named here):
    one scheme with memory against itself without (the memory verdict's pair), and two cells of 2 seeds."""
    keys = {c: _key(c) for c in CELLS}
    memory = [
        (a, b) for a in CELLS for b in CELLS if keys[a].scheme == keys[b].scheme and keys[a].memory > keys[b].memory
    ]
    two = [c for c in CELLS if SEEDS[c] == 2]
    return {"memory": memory[0] if memory else PAIR, "two_seeds": tuple(two[:2]) if len(two) >= 2 else PAIR}


def _row(name: str, r: dict) -> str:
    return (
        f"| {name} | {r['coverage']:.3f} | {r['below']:.3f} | {r['above']:.3f} | {r['one_sided_5pct']:.3f} | "
        f"{r['median_df']:.1f} | {r['median_width']:.4f} |"
    )


def main(argv=None) -> int:
    """python -m posenc_lab_analysis.coverage [--reps N]: coverage and verdict error rates at the measured
    components, for the default split, the split before it and a designed one (the tables of analysis/README.md)."""
    p = argparse.ArgumentParser(prog="python -m posenc_lab_analysis.coverage", description=main.__doc__)
    p.add_argument("--reps", type=int, default=2000)
    p.add_argument("--verdict-reps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    layouts = (SPLIT, BEFORE, designed())
    head = (
        f"| coverage of the {LEVEL:.0%} interval | wholly below 0 | wholly above 0 | one-sided 5% test rejects "
        "| median df | median width |"
    )
    print(f"| difference | {head[2:]}\n|---|---|---|---|---|---|---|")
    pairs, at = _pairs(), lambda **k: Components(**{**MEASURED.__dict__, **k})
    rows = [
        (f"{PAIR[0]} - {PAIR[1]}, measured", dict(comps=MEASURED)),
        (f"{pairs['memory'][0]} - {pairs['memory'][1]}, file SD 0 (the memory verdict's measured configuration)",
         dict(comps=at(file_sd=0.0), pair=pairs["memory"])),
        (f"{PAIR[0]} - {PAIR[1]}, seed s of both cells correlated 0.7 (shared seeds analysed as independent)",
         dict(comps=MEASURED, seed_corr=0.7)),
        (f"{pairs['two_seeds'][0]} - {pairs['two_seeds'][1]} (2 seeds a side), measured",
         dict(comps=MEASURED, pair=pairs["two_seeds"])),
        (f"{PAIR[0]} - {PAIR[1]}, file SD 0.1 all in the families, exponential family effects (skewed; the text "
         "dominates)",
         dict(comps=at(file_sd=0.1, icc=1.0), skewed=True)),
        ("the same, normal family effects", dict(comps=at(file_sd=0.1, icc=1.0))),
    ]  # fmt: skip
    for name, kw in rows:
        print(_row(name, coverage(SPLIT, reps=a.reps, seed=a.seed, **kw)), flush=True)
    print(f"\n| layout | units | ICC | {head[2:]}\n|---|---|---|---|---|---|---|---|---|")
    for lay in layouts:
        for units in ("file", "family"):
            for icc in sorted({0.0, MEASURED.icc, 0.5, 0.72}):
                r = coverage(lay, at(icc=icc), a.reps, a.seed, units)
                print(_row(f"{lay.name} | {units} | {icc:.2f}", r), flush=True)
    for lay in layouts:
        df = error_rates(lay, MEASURED, a.verdict_reps, a.seed)
        print(f"\n{lay.name}, global null, {a.verdict_reps} ablations; any false claim: {df.attrs['any_false']:.3f}")
        print(markdown_table(df, default=3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
