"""`posenc-lab compare` on a word corpus: each side's figure is the corpus's own (perplexity), not its loss in nats."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from posenc_lab.compose import derived_keys
from posenc_lab.train import train
from posenc_lab_analysis import compare
from tests.helpers_train import compose_config, tiny


def _wikitext2(root):
    """WikiText-2's three files as an offline machine holds them (<cache>/wikitext2/wikitext-2/), of random words;
    the test split spans three documents (chunks of 4,096 words)."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(40)])
    folder = root / "wikitext2" / "wikitext-2"
    folder.mkdir(parents=True)
    for name, n_lines in (("train", 600), ("valid", 100), ("test", 800)):
        lines = (" ".join(rng.choice(words, 12, p=np.arange(40, 0, -1) / 820)) for _ in range(n_lines))
        (folder / f"wiki.{name}.tokens").write_text("".join(f" {line} \n" for line in lines))
    return root


@pytest.fixture(scope="module")
def word_runs(tmp_path_factory):
    """Two tiny runs on the word corpus (with memory and without)."""
    work = tmp_path_factory.mktemp("word-runs")
    cache = _wikitext2(work / "cache")
    for name, mem in (("mem16", 16), ("mem0", 0)):
        train(compose_config("train", tiny(work / name, cache, f"model.mem_len={mem}", data="wikitext2", steps=4)))
    return work


def test_compare_prints_perplexity_on_a_word_corpus(word_runs, tmp_path, capsys):
    args = [
        str(word_runs / "mem16"),
        str(word_runs / "mem0"),
        "--n-streams",
        "4",
        "--n-tokens",
        "64",
        "--split",
        "test",
    ]
    assert compare.main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    shown = {}
    for side in ("A", "B"):
        label = r" \(one seed: the text only, no seed variation\)"  # each side is one run: labelled in its row
        found = re.search(rf"^{side}: .* test ppl (\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]{label}$", out, re.M)
        assert found, out
        shown[side] = [float(x) for x in found.groups()]
        (dump,) = tmp_path.glob(f"{side}_*.npz")
        with np.load(dump) as d:
            mean_nats = float(d["loss"][0][d["scored"]].mean())
        assert shown[side][0] == pytest.approx(math.exp(mean_nats), rel=1e-3)  # exp of the mean loss, not the loss
        assert shown[side][1] < shown[side][0] < shown[side][2]
    difference = float(re.search(r"A - B: ([-+]\d+\.\d+) \[.*\] nats per word", out).group(1))
    assert difference == pytest.approx(math.log(shown["A"][0] / shown["B"][0]), abs=2e-4)  # a log-ppl difference


@pytest.fixture(scope="module")
def cell(word_runs):
    """A folder of one cell's seeds (the documented form of a side): mem16 with seeds 0 and 1, trained from Python
    (no .hydra/: the seed's derived keys come from the project's config)."""
    cache = word_runs / "cache"
    for seed in (0, 1):
        run = word_runs / "cell" / f"seed{seed}"
        train(compose_config("train", tiny(run, cache, "model.mem_len=16", f"seed={seed}", data="wikitext2", steps=4)))
    return word_runs / "cell"


def test_a_folder_of_one_cells_seeds_is_compared_though_data_seed_is_the_seed(cell, word_runs, capsys):
    """data.seed is ${seed}: it differs between the seeds, and was refused as a difference beyond the seed."""
    seeds = sorted(p.name for p in cell.iterdir())
    assert seeds == ["seed0", "seed1"]
    identities = [json.loads((cell / s / "run.json").read_text())["identity"]["data"]["seed"] for s in seeds]
    assert identities == [0, 1]  # what the refusal tripped on
    args = [str(cell), str(word_runs / "mem0"), "--n-streams", "4", "--n-tokens", "64", "--split", "test"]
    assert compare.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.search(rf"^A: {re.escape(str(cell))} \(2 seed\(s\)\): test ppl ", out, re.M), out
    (diff,) = [line for line in out.splitlines() if line.startswith("A - B: ")]
    assert "(one seed: the text only, no seed variation)" in diff  # B is one run: the row says so
    (a_line,) = [line for line in out.splitlines() if line.startswith("A: ")]
    assert "the text only" not in a_line  # A has two seeds


def test_a_key_the_run_fixed_is_a_difference_beyond_the_seed(cell, tmp_path, capsys):
    """Which keys derive from the seed is read from the run's own composed config (.hydra/config.yaml, as
    `posenc-lab train` writes it): a run whose data.seed was set on its own differs by more than its seed."""
    folder = tmp_path / "cell"
    shutil.copytree(cell, folder)
    composed = OmegaConf.to_container(compose_config("train", ["data=wikitext2", "data.seed=0"]), resolve=False)
    (folder / "seed0" / ".hydra").mkdir()
    (folder / "seed0" / ".hydra" / "config.yaml").write_text(yaml.safe_dump(composed))
    assert compare.main([str(folder), str(cell), "--n-streams", "2", "--n-tokens", "32"]) == 2
    err = capsys.readouterr().err
    assert "differ by more than their seed (seed0 vs seed1: data.seed: run 0, now 1)" in err, err
    assert len(err.strip().splitlines()) == 1


def test_derived_keys_follow_chained_interpolations():
    composed = compose_config("train", ["data=recall", "+data.corpus.stream_seed=${data.seed}"])
    keys = derived_keys(OmegaConf.to_container(composed, resolve=False))
    assert {"seed", "data.seed", "data.corpus.stream_seed"} <= keys
    assert "data.corpus.seed" not in keys and "optim.lr" not in keys  # a fixed value, and one that is no seed


@pytest.mark.parametrize("form", ["same run", "same folder", "a folder and a run in it", "a link to the run"])
def test_a_run_compared_with_itself_is_refused_before_any_evaluation(cell, tmp_path, capsys, form):
    """A difference of a run with itself printed "t with inf df"; now one line naming the path and what is valid."""
    a, b = {
        "same run": (cell / "seed0", cell / "seed0"),
        "same folder": (cell, cell),
        "a folder and a run in it": (cell, cell / "seed1"),
        "a link to the run": (cell / "seed0", tmp_path / "link"),
    }[form]
    (tmp_path / "link").symlink_to(cell / "seed0")
    assert compare.main([str(a), str(b), "--n-streams", "2", "--n-tokens", "32"]) == 2
    captured = capsys.readouterr()
    assert "evaluating" not in captured.out  # refused before any evaluation
    line = captured.err.strip()
    assert len(line.splitlines()) == 1 and str(a) in line, line
    assert "compare two different runs or cells" in line, line


@pytest.mark.parametrize("form", ["a run and its copy", "a cell and a folder holding a copy", "a cell with a copy"])
def test_a_copy_of_a_run_is_the_same_run_refused_before_any_evaluation(cell, tmp_path, capsys, form):
    """A `cp -r` copy has the run's identity (configuration, seed) and its checkpoint's bytes: the same run, whose
    difference with itself printed "+0.0000 [+0.0000, +0.0000] ... inf df". One line says which run is a copy."""
    copy = tmp_path / "folder" / "copy"
    shutil.copytree(cell / "seed0", copy)
    a, b, message = {
        "a run and its copy": (cell / "seed0", copy, f"B's run {copy} is a copy of A's run {cell / 'seed0'}"),
        "a cell and a folder holding a copy": (
            cell,
            copy.parent,
            f"B's run {copy} is a copy of A's run {cell / 'seed0'}",
        ),
        "a cell with a copy": (copy.parent, cell / "seed1", f"holds one run twice: {copy.parent / 'copy'} and "),
    }[form]
    if form == "a cell with a copy":
        shutil.copytree(cell / "seed0", copy.parent / "original")
    assert compare.main([str(a), str(b), "--n-streams", "2", "--n-tokens", "32"]) == 2
    captured = capsys.readouterr()
    assert "evaluating" not in captured.out  # refused before any evaluation
    (line,) = captured.err.strip().splitlines()
    assert message in line and "the same configuration" in line and "SHA-256" in line, line


def test_a_rerun_of_the_same_seed_is_not_a_copy(cell, word_runs):
    """Another process's training of the same configuration and seed saves other bytes: it is compared, not refused."""
    a, b = (compare.find_runs([p]) for p in (word_runs / "mem16", cell / "seed0"))
    assert (a[0].path / "run.json").is_file()
    same = [json.loads((r[0].path / "run.json").read_text())["identity"] for r in (a, b)]
    assert same[0] == same[1]  # the same identity: only the checkpoint's bytes tell them apart
    assert compare.copies(a, b) is None


def test_compare_prints_no_p_value_below_what_its_df_support(monkeypatch, capsys, tmp_path):
    """A difference far beyond its interval on a handful of df: the p-values print as the bound below what the
    df support ("< 1e-3", ``stats.p_text``), never as a raw tail like 1.2e-40."""
    from posenc_lab_analysis.stats import Difference

    d = Difference(-0.5, -0.52, -0.48, 0.95, 0.005, 4.0, 3, 3, 40, True)
    mean = Difference(3.0, 2.9, 3.1, 0.95, 0.05, 4.0, 3, 3, 40, True)
    result = dict(figure="bpb", unit="bits per byte", corpus_unit="byte", a=mean, b=mean, difference=d, tokens=1000)
    monkeypatch.setattr(compare, "sides", lambda a, b: ([None] * 3, [None] * 3))
    monkeypatch.setattr(compare, "compare", lambda *a, **k: {**result, "units": 40, "unit_kind": "families"})
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "one-sided p that A is lower: < 1e-3, higher: 1" in out, out
    assert "e-" not in out.split("one-sided p")[1].replace("< 1e-3", "")


def test_an_ssmax_run_is_compared_as_a_cell_of_its_own(word_runs, capsys):
    """A run with model.softmax_scale=ssmax against the same scheme without: compare names A's cell <scheme>+ssmax
    and B's <scheme>, and judges the difference."""
    cache, run = word_runs / "cache", word_runs / "ssmax16"
    overrides = tiny(run, cache, "model.mem_len=16", "model.softmax_scale=ssmax", data="wikitext2", steps=4)
    train(compose_config("train", overrides))
    args = [str(run), str(word_runs / "mem16"), "--n-streams", "2", "--n-tokens", "32", "--split", "test"]
    assert compare.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    scheme = compose_config("train", overrides).posenc.name
    assert re.search(rf"^  evaluating A: {scheme}\+ssmax:mem16, seed 0 \(", out, re.M), out
    assert re.search(rf"^  evaluating B: {scheme}:mem16, seed 0 \(", out, re.M), out
    assert re.search(r"^A - B: [-+]\d+\.\d+ \[", out, re.M), out
