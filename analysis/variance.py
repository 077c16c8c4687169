"""The variance components of the as-trained losses, measured on per-token dumps: what the coverage simulation
(``coverage.py``) and the power statement (``power.py``) take as given.

For cells a, b with seeds s and files k (n_k scored tokens; family g(k)), the seed-averaged difference of
file means is d_k = theta + f_g(k) + u_k + e_k: f the family's effect, u the file's own, e the token noise
of the seeds (its variance v_k estimated from the seed-to-seed spread of the file sums, the seeds' global
shift taken out). Moments, each unbiased under that model:

    file SD        tau^2  = [sum_k w_k (d_k - dbar)^2 - sum_k w_k v_k (1 - w_k)] / (1 - sum_k w_k^2)
                   (w_k = n_k / N: files weighted by their tokens, dbar = sum_k w_k d_k)
    family part    tau_f^2 = sum over pairs k != l of one family of w_k w_l (d_k - dbar)(d_l - dbar) / sum w_k w_l
    intra-family correlation  rho = tau_f^2 / tau^2
    seed SD        sigma^2 = var_s(m[s]) - (token noise of one seed's mean)

``python -m posenc_lab_analysis.variance DUMPS_DIR [--out FILE.json] [--components [FILE.json]]``: DUMPS_DIR is a
report's ``dumps/as_trained/`` (or the report's ``dumps/``): the files are the dumps' documents and the families
their units, on any corpus. ``--components`` writes what the simulation and the power statement read
(``simulation_inputs``; default: analysis/variance_components.json). Pure numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from posenc_lab.cellnames import CellName

COMPONENTS_FILE = Path(__file__).with_name("variance_components.json")  # what coverage.py and ablate --plan read


@dataclass(frozen=True)
class PairComponents:
    """The components of one difference a - b (nats): its estimate, the file SD, the family part, rho."""

    a: str
    b: str
    estimate: float
    file_sd: float
    family_sd: float
    icc: float


def _file_sums(x: np.ndarray, files: np.ndarray, K: int) -> np.ndarray:
    return np.stack([np.bincount(files, weights=row, minlength=K) for row in x])


def _noise(sums: np.ndarray, n_k: np.ndarray) -> np.ndarray:
    """[K] variance of the seed-averaged file sums from seed to seed, each seed's global shift taken out."""
    n = sums.shape[0]
    m = sums.sum(1) / n_k.sum()
    resid = sums - sums.mean(0) - np.outer(m - m.mean(), n_k)
    return (resid**2).sum(0) / ((n - 1) * n)


def pair_components(a, b, files, family, names=("a", "b"), law: tuple[float, float] | None = None):
    """The components of a - b. a, b: [n_seeds, tokens]; files: [tokens] file index 0..K-1; family: [K] the
    family of each file. A side with one seed takes its token noise from ``law`` (``noise_law``)."""
    K = int(files.max()) + 1
    n_k = np.bincount(files, minlength=K).astype(float)
    keep = n_k > 0

    def noise(S):
        if len(S) >= 2:
            return _noise(S, n_k)
        if law is None:
            raise ValueError(f"{names}: a cell with one seed needs the noise law")
        return law[0] * np.maximum(n_k, 1) ** (2 - law[1])

    A, B = _file_sums(a, files, K), _file_sums(b, files, K)
    d = ((A.mean(0) - B.mean(0))[keep] / n_k[keep]).astype(float)
    v = ((noise(A) + noise(B))[keep] / n_k[keep] ** 2).astype(float)
    fam, w = np.asarray(family)[keep], n_k[keep] / n_k[keep].sum()
    centred = d - (w * d).sum()
    # token-weighted moments (a file of 12 tokens counts as 12 tokens): E sum w (d - dbar)^2 = tau^2 (1 - sum w^2)
    # + sum w v (1 - w)
    tau2 = ((w * centred**2).sum() - (w * v * (1 - w)).sum()) / (1 - (w**2).sum())
    pairs = [(i, j) for g in np.unique(fam) for i, j in combinations(np.flatnonzero(fam == g), 2)]
    pw = np.array([w[i] * w[j] for i, j in pairs])
    tau_f2 = float(sum(p * centred[i] * centred[j] for p, (i, j) in zip(pw, pairs)) / pw.sum()) if pairs else np.nan
    theta = float((A.mean(0) - B.mean(0)).sum() / n_k.sum())
    sd = float(np.sqrt(max(tau2, 0.0)))
    icc = float(np.clip(tau_f2 / tau2, -1, 1)) if tau2 > 0 else float("nan")
    return PairComponents(names[0], names[1], theta, sd, float(np.sqrt(max(tau_f2, 0.0))), icc)


def seed_sd(x: np.ndarray, files: np.ndarray) -> tuple[float, float]:
    """(SD of the per-seed means, SD of the seed effect with one seed's token noise taken out) of one cell
    [n_seeds >= 2, tokens]."""
    K = int(files.max()) + 1
    n_k = np.bincount(files, minlength=K).astype(float)
    sums = _file_sums(x, files, K)
    n, N = sums.shape[0], n_k.sum()
    m = sums.sum(1) / N
    one_seed_noise = float(_noise(sums, n_k).sum() * n / N**2)
    return float(np.std(m, ddof=1)), float(np.sqrt(max(0.0, np.var(m, ddof=1) - one_seed_noise)))


def noise_law(cells: dict[str, np.ndarray], files: np.ndarray) -> tuple[float, float]:
    """(kappa, gamma) of the per-seed token noise of a file mean, Var = kappa n_k^-gamma, fitted on the log
    scale over files and cells."""
    K = int(files.max()) + 1
    n_k = np.bincount(files, minlength=K).astype(float)
    logs, sizes = [], []
    for x in cells.values():
        if x.shape[0] < 2:
            continue
        v = _noise(_file_sums(x, files, K), n_k) * x.shape[0] / np.maximum(n_k, 1) ** 2
        ok = (n_k > 0) & (v > 0)
        logs.append(np.log(v[ok]))
        sizes.append(np.log(n_k[ok]))
    slope, intercept = np.polyfit(np.concatenate(sizes), np.concatenate(logs), 1)
    return float(np.exp(intercept)), float(-slope)


def _pooled_seed_r(cells: dict[str, np.ndarray], seeds: dict[str, list[int]], pairs: list) -> tuple[float, float]:
    """(pooled correlation, variance ratio) of the centred seed means over ``pairs`` [(a, b, shared seeds)]."""
    ab = aa = bb = dd = 0.0
    for a, b, common in pairs:
        ma = cells[a][[seeds[a].index(s) for s in common]].mean(1)
        mb = cells[b][[seeds[b].index(s) for s in common]].mean(1)
        ma, mb = ma - ma.mean(), mb - mb.mean()
        ab, aa, bb, dd = ab + ma @ mb, aa + ma @ ma, bb + mb @ mb, dd + (ma - mb) @ (ma - mb)
    return float(ab / np.sqrt(aa * bb)), float(dd / (aa + bb))


def seed_correlation(
    cells: dict[str, np.ndarray],
    seeds: dict[str, list[int]],
    files: np.ndarray,
    same: Callable[[str, str], bool],
    relabellings: int = 2000,
) -> dict:
    """How much seed s of one cell resembles seed s of another (every cell trained with ``seed_everything(s)``:
    the same initialisation where the parameters agree, the same data order), pooled over the pairs of cells that
    share at least 2 seeds, apart for the pairs ``same(a, b)`` (one scheme with and without memory: the same
    parameters) and the rest. On each pair's shared seeds, the centred per-seed means a_s, b_s: ``means_r`` = sum
    a_s b_s / sqrt(sum a_s^2 sum b_s^2) pooled over the pairs, and ``variance_ratio`` = sum (a_s - b_s)^2 /
    sum (a_s^2 + b_s^2), the variance of a seed-by-seed difference over that of independent seeds (1 - r at
    equal spreads): what pairing by seed would buy (< 1). ``null_90``: the 5% and 95% points of ``means_r`` when
    each cell's seeds are relabelled at random (no pairing at all), the noise of so few seeds. ``files_r``: the
    correlation of the seeds' file means, each seed's global shift out (token-weighted)."""
    K = int(files.max()) + 1
    n_k = np.bincount(files, minlength=K).astype(float)
    rng = np.random.default_rng(0)
    out = {}
    for group, want in (("same_scheme", True), ("other_schemes", False)):
        pairs = [
            (a, b, common)
            for a, b in combinations(cells, 2)
            if same(a, b) == want and len(common := sorted(set(seeds[a]) & set(seeds[b]))) >= 2
        ]
        if not pairs:
            continue
        r, ratio = _pooled_seed_r(cells, seeds, pairs)
        null = [
            _pooled_seed_r(cells, {c: list(rng.permutation(s)) for c, s in seeds.items()}, pairs)[0]
            for _ in range(relabellings)
        ]
        fab = faa = fbb = 0.0
        for a, b, common in pairs:
            ra, rb = (
                _file_sums(cells[c][[seeds[c].index(s) for s in common]], files, K) / np.maximum(n_k, 1) for c in (a, b)
            )
            ra, rb = (
                x
                - x.mean(0)
                - ((x * n_k).sum(1, keepdims=True) / n_k.sum() - (x * n_k).sum() / n_k.sum() / len(x)) * (n_k > 0)
                for x in (ra, rb)
            )
            fab, faa, fbb = fab + (n_k * ra * rb).sum(), faa + (n_k * ra**2).sum(), fbb + (n_k * rb**2).sum()
        out[group] = {
            "pairs": [{"a": a, "b": b, "seeds": common} for a, b, common in pairs],
            "means_r": r,
            "variance_ratio": ratio,
            "null_90": [float(np.quantile(null, 0.05)), float(np.quantile(null, 0.95))],
            "files_r": float(fab / np.sqrt(faa * fbb)),
        }
    return out


def layout(files: np.ndarray, family: np.ndarray) -> dict:
    """Files, families, their scored tokens, the largest family's share and the effective number of families
    (1 / sum of squared token shares)."""
    K = int(files.max()) + 1
    n_k = np.bincount(files, minlength=K)
    keep = np.flatnonzero(n_k > 0)
    fam = np.asarray(family)[keep]
    ids, inverse = np.unique(fam, return_inverse=True)
    tokens = np.bincount(inverse, weights=n_k[keep]).astype(int)
    w = tokens / tokens.sum()
    return {
        "files": int(len(keep)),
        "families": int(len(ids)),
        "largest_share": float(w.max()),
        "effective_families": float(1 / np.sum(w**2)),
        "file_tokens": n_k[keep].astype(int).tolist(),
        "file_family": inverse.astype(int).tolist(),
    }


def _same_scheme(a: str, b: str) -> bool:
    """One scheme, loss and group, with and without memory (or another memory): the same parameters."""
    x, y = CellName.parse(a), CellName.parse(b)
    return (x.scheme, x.loss_frac, x.group) == (y.scheme, y.loss_frac, y.group)


def measure(
    cells: dict[str, np.ndarray], files: np.ndarray, family: np.ndarray, seeds: dict[str, list[int]] | None = None
) -> dict:
    """Every component of a group of cells (name -> [n_seeds, tokens]) on shared tokens; ``seeds``: each cell's
    seed of every row (default 0, 1, ...), for the seed correlation."""
    seeded = {c: x for c, x in cells.items() if x.shape[0] >= 2}
    kappa, gamma = noise_law(cells, files)
    pairs = [
        pair_components(cells[a], cells[b], files, family, (a, b), (kappa, gamma)) for a, b in combinations(cells, 2)
    ]
    return {
        "layout": layout(files, family),
        "cells": {c: int(x.shape[0]) for c, x in cells.items()},
        "seeds": {
            c: dict(zip(("sd_of_means", "seed_sd"), seed_sd(x, files))) | {"n": x.shape[0]} for c, x in seeded.items()
        },
        "pairs": [asdict(p) for p in pairs],
        "median_file_sd": float(np.median([p.file_sd for p in pairs])) if pairs else float("nan"),
        "median_icc": float(np.nanmedian([p.icc for p in pairs])) if pairs else float("nan"),
        "noise": {"kappa": kappa, "gamma": gamma},
        "seed_correlation": seed_correlation(
            cells, seeds or {c: list(range(len(x))) for c, x in cells.items()}, files, _same_scheme
        ),
    }


def simulation_inputs(res: dict, pair: tuple[str, str]) -> dict:
    """What ``coverage.py`` and ``ablate --plan`` read, from ``measure``'s result: the file SD of ``pair`` (the
    difference whose interval the simulation studies: a close pair of the verdicts), the median intra-family
    correlation over every pair (one pair's rests on few families; a negative one is simulated as 0), the token
    noise law, each cell's seed SD (the median for ``default_seed_sd``), the median SD of the seed means (for the
    power statement), each cell's seeds and the layout."""
    (found,) = [q for q in res["pairs"] if {q["a"], q["b"]} == set(pair)] or [None]
    if found is None:
        raise ValueError(f"no pair {pair[0]} - {pair[1]} in the dumps; their cells: {', '.join(res['cells'])}")
    seed_sd = {c: round(s["seed_sd"], 4) for c, s in res["seeds"].items()}
    return {
        "components": {
            "file_sd": round(found["file_sd"], 4),
            "icc": round(max(0.0, res["median_icc"]), 2),
            "kappa": round(res["noise"]["kappa"], 4),
            "gamma": round(res["noise"]["gamma"], 3),
            "default_seed_sd": round(float(np.median(list(seed_sd.values()))), 4),
            "seed_sd": seed_sd,
            "seed_sd_of_means": round(float(np.median([s["sd_of_means"] for s in res["seeds"].values()])), 4),
        },
        "seeds": res["cells"],
        "coverage_pair": list(pair),
        "layout": res["layout"],
    }


def from_dumps(folder: Path) -> dict:
    """The components of the as-trained dumps in ``folder`` (a report's dumps/ or dumps/as_trained/): the files are
    the dumps' documents, their families the dumps' units (``TokenLosses``), so any corpus serves."""
    from .dumps import UNITS, file_layout, read_dump, same_tokens

    folder = folder / "as_trained" if (folder / "as_trained").is_dir() else folder
    loaded = {p.stem: read_dump(p) for p in sorted(folder.glob("*.npz"))}
    if not loaded:
        raise ValueError(f"{folder} holds no as-trained dumps (<run>.npz)")
    if stale := sorted(name for name, d in loaded.items() if d.meta.get("units") != UNITS):
        raise ValueError(f"{', '.join(stale)}: dumps of before the units were families; rerun the report first")
    same_tokens(loaded)  # one group: the same scored tokens in every dump
    first = next(iter(loaded.values()))
    files, family = file_layout(first.token_documents, first.token_units)
    cells: dict[str, list] = {}
    seeds: dict[str, list] = {}
    for d in loaded.values():
        cells.setdefault(d.meta["cell"], []).append(d.at().astype(np.float64))
        seeds.setdefault(d.meta["cell"], []).append(int(d.meta.get("seed", len(seeds.get(d.meta["cell"], [])))))
    return measure({c: np.stack(v) for c, v in cells.items()}, files, family, seeds)


def main(argv=None) -> int:
    """python -m posenc_lab_analysis.variance DUMPS_DIR [--out FILE] [--components [FILE]]: the variance
    components of a report's as-trained dumps, printed and written as JSON."""
    p = argparse.ArgumentParser(prog="python -m posenc_lab_analysis.variance", description=main.__doc__)
    p.add_argument("dumps", type=Path)
    p.add_argument("--out", type=Path, help="every measured figure, as JSON")
    p.add_argument(
        "--components",
        type=Path,
        nargs="?",
        const=COMPONENTS_FILE,
        help="write the simulation's inputs here (default: analysis/variance_components.json)",
    )
    p.add_argument("--pair", nargs=2, help="the simulated difference's two cells (default: the file's own pair)")
    a = p.parse_args(argv)
    try:
        res = from_dumps(a.dumps)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lay = res["layout"]
    print(
        f"{lay['files']} files in {lay['families']} families; largest family {lay['largest_share']:.1%} of the "
        f"scored tokens; effective number of families {lay['effective_families']:.1f}"
    )
    for c, s in res["seeds"].items():
        print(f"seed SD {c}: {s['seed_sd']:.4f} nats (SD of the seed means {s['sd_of_means']:.4f}, {s['n']} seeds)")
    for q in res["pairs"]:
        print(
            f"{q['a']} - {q['b']}: {q['estimate']:+.4f}; file SD {q['file_sd']:.4f}, family SD {q['family_sd']:.4f}, "
            f"intra-family correlation {q['icc']:.2f}"
        )
    print(f"median file SD {res['median_file_sd']:.4f}, median intra-family correlation {res['median_icc']:.2f}")
    print(f"token noise of a file mean, one seed: {res['noise']['kappa']:.3g} n^-{res['noise']['gamma']:.2f}")
    for group, r in res["seed_correlation"].items():
        print(
            f"seed s of one cell against seed s of another ({group.replace('_', ' ')}, {len(r['pairs'])} pairs): "
            f"correlation of the seed means {r['means_r']:+.2f}, of the file means {r['files_r']:+.2f}; variance of "
            f"a seed-by-seed difference / of independent seeds {r['variance_ratio']:.2f} (seeds relabelled at random: "
            f"r {r['null_90'][0]:+.2f} to {r['null_90'][1]:+.2f}, 90%)"
        )
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    if a.components:
        try:
            pair = a.pair or json.loads(a.components.read_text())["coverage_pair"]
            inputs = simulation_inputs(res, tuple(pair))
        except (ValueError, OSError, KeyError) as e:
            print(f"error: --components: {e} (name the pair with --pair A B)", file=sys.stderr)
            return 2
        a.components.write_text(json.dumps(inputs, indent=1) + "\n")
        print(f"wrote {a.components}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
