"""`posenc-lab compare` on a word corpus: each side's figure is the corpus's own (perplexity), not its loss in nats."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

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
        found = re.search(rf"^{side}: .* test ppl (\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]$", out, re.M)
        assert found, out
        shown[side] = [float(x) for x in found.groups()]
        (dump,) = tmp_path.glob(f"{side}_*.npz")
        with np.load(dump) as d:
            mean_nats = float(d["loss"][0][d["scored"]].mean())
        assert shown[side][0] == pytest.approx(math.exp(mean_nats), rel=1e-3)  # exp of the mean loss, not the loss
        assert shown[side][1] < shown[side][0] < shown[side][2]
    difference = float(re.search(r"A - B: ([-+]\d+\.\d+) \[.*\] nats per word", out).group(1))
    assert difference == pytest.approx(math.log(shown["A"][0] / shown["B"][0]), abs=2e-4)  # a log-ppl difference
