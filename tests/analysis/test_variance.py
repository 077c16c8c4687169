"""The variance components (posenc_lab_analysis.variance): the moment estimators recover components planted by the
coverage simulation, and the command reads a report's dumps (files from their documents, families from their
units) and writes what the simulation and ``ablate --plan`` read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posenc_lab_analysis import variance
from posenc_lab_analysis.coverage import Components, Simulator, designed
from posenc_lab_analysis.dumps import UNITS, TokenLosses, _write


def _planted(file_sd: float, icc: float, seed_sd: float) -> Components:
    return Components(file_sd=file_sd, icc=icc, kappa=0.11, gamma=0.9, default_seed_sd=seed_sd)


@pytest.mark.parametrize("icc", [0.0, 0.6])
def test_the_moments_recover_the_planted_file_sd_and_intra_family_correlation(icc):
    """60 families of 1-3 files, 3 seeds a cell: averaged over 40 simulated ablations the file SD of a - b is the
    planted one within 10% and the intra-family correlation within 0.15 (one ablation's are noisy)."""
    sim = Simulator(designed(families=60, seed=3), _planted(0.05, icc, 0.0))
    rng = np.random.default_rng(7)
    family = np.zeros(sim.K, dtype=int)
    family[sim.file] = sim.family
    tau2, rho = [], []
    for _ in range(40):
        c = variance.pair_components(sim.cell(rng, "a", 3), sim.cell(rng, "b", 3), sim.file, family)
        tau2.append(c.file_sd**2)
        rho.append(c.icc)
    assert np.sqrt(np.mean(tau2)) == pytest.approx(0.05, rel=0.1)
    assert np.mean(rho) == pytest.approx(icc, abs=0.15)


def test_the_seed_sd_takes_the_token_noise_out():
    """A cell whose seeds differ by their token noise alone has a seed SD near 0 but a spread of its seed means;
    a planted seed effect of 0.02 nats is found."""
    rng = np.random.default_rng(1)
    sim = Simulator(designed(families=40, seed=1), _planted(0.05, 0.0, 0.0))
    quiet = [variance.seed_sd(sim.cell(rng, "a", 6), sim.file) for _ in range(20)]
    assert np.mean([q[1] for q in quiet]) < 0.5 * np.mean([q[0] for q in quiet])
    sim = Simulator(designed(families=40, seed=1), _planted(0.05, 0.0, 0.02))
    loud = [variance.seed_sd(sim.cell(rng, "a", 6), sim.file)[1] for _ in range(20)]
    assert np.sqrt(np.mean(np.square(loud))) == pytest.approx(0.02, rel=0.2)


def _dump(folder, run, cell, loss, documents, units, kind=UNITS):
    rows = 1
    scored = np.ones((rows, loss.size), dtype=bool)
    d = TokenLosses(
        loss=loss.reshape(1, rows, -1),
        correct=np.zeros((1, rows, loss.size), dtype=bool),
        documents=documents.reshape(rows, -1),
        units=units.reshape(rows, -1),
        scored=scored,
        distance=np.zeros((rows, loss.size), dtype=np.int64),
        contexts=[64],
        meta={"cell": cell, "run": run, "units": kind},
    )
    _write(folder / f"{run}.npz", d)


def test_the_command_reads_files_and_families_from_the_dumps_and_writes_the_simulation_inputs(tmp_path, capsys):
    """Documents 10, 11, 12 in family 7 (the first two) and 9: three files, two families, the largest 3/4 of the
    tokens; the written inputs build the simulation's Components, each cell with its seeds."""
    documents = np.repeat([10, 11, 12], [300, 300, 200])
    units = np.repeat([7, 7, 9], [300, 300, 200])
    rng = np.random.default_rng(0)
    folder = tmp_path / "dumps" / "as_trained"
    folder.mkdir(parents=True)
    for cell, seeds, shift in (("x:mem8", 3, 0.0), ("y:mem8", 2, 0.3)):
        for s in range(seeds):
            _dump(folder, f"{cell}_{s}", cell, 2.0 + shift + rng.normal(0, 0.5, documents.size), documents, units)
    components = tmp_path / "components.json"
    components.write_text(json.dumps({"coverage_pair": ["y:mem8", "x:mem8"]}))
    assert (
        variance.main([str(tmp_path / "dumps"), "--components", str(components), "--out", str(tmp_path / "all")]) == 0
    )
    out = capsys.readouterr().out
    measured = json.loads((tmp_path / "all").read_text())
    assert "3 files in 2 families; largest family 75.0% of the scored tokens" in out
    written = json.loads(components.read_text())
    assert written["seeds"] == {"x:mem8": 3, "y:mem8": 2} and written["coverage_pair"] == ["y:mem8", "x:mem8"]
    assert written["layout"]["file_tokens"] == [300, 300, 200] and written["layout"]["file_family"] == [0, 0, 1]
    comps = Components(**written["components"])
    (pair,) = measured["pairs"]
    assert comps.file_sd == round(pair["file_sd"], 4) and comps.icc == round(max(0.0, measured["median_icc"]), 2)
    seeds = measured["seeds"]
    assert comps.seed_sd == {c: round(seeds[c]["seed_sd"], 4) for c in ("x:mem8", "y:mem8")}
    assert comps.default_seed_sd == round(float(np.median([seeds[c]["seed_sd"] for c in seeds])), 4)
    assert comps.seed_sd_of_means == round(float(np.median([seeds[c]["sd_of_means"] for c in seeds])), 4)
    assert comps.seed_sd_of_means > comps.default_seed_sd  # the token noise of the seed means is in it

    assert variance.main([str(tmp_path / "dumps"), "--components", str(components), "--pair", "x:mem8", "z"]) == 2
    assert "no pair x:mem8 - z in the dumps; their cells: x:mem8, y:mem8" in capsys.readouterr().err


def test_dumps_of_before_the_family_units_are_refused_by_name(tmp_path):
    """A dump whose units were its documents would make every file its own family: named, not measured."""
    documents = np.repeat([0, 1], 50)
    for run, kind in (("a_0", UNITS), ("a_1", UNITS), ("b_0", "document")):
        _dump(tmp_path, run, run[0], np.ones(100), documents, documents, kind)
    with pytest.raises(ValueError, match=r"^b_0: dumps of before the units were families; rerun the report first"):
        variance.from_dumps(tmp_path)


@pytest.mark.parametrize(("planted", "low", "high"), [(0.0, -0.35, 0.35), (0.8, 0.5, 1.0)])
def test_the_seed_correlation_of_cells_sharing_seeds_is_recovered(planted, low, high):
    """Seed s of every cell shares a draw (seed_everything(s)), correlated at ``planted`` with each cell's seed
    effect (seed SD 0.02 against the token noise): the pooled correlation of the seed means over 4 cells of 6
    seeds is near it, and the variance of a seed-by-seed difference falls below that of independent seeds with it."""
    sim = Simulator(designed(families=40, seed=1), _planted(0.02, 0.0, 0.02))
    rng = np.random.default_rng(9)
    shared = rng.normal(0, 1, 6)
    cells = {f"c{i}": sim.cell(rng, f"c{i}", 6, shared=shared, seed_corr=planted) for i in range(4)}
    r = variance.seed_correlation(cells, {c: list(range(6)) for c in cells}, sim.file, lambda a, b: False)
    got = r["other_schemes"]
    assert low <= got["means_r"] <= high and len(got["pairs"]) == 6
    assert (got["variance_ratio"] < 0.5) == (planted > 0.5)
