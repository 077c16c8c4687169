"""A corpus is one module and one yaml (the README's "Add a corpus"): a throwaway corpus, written to a temporary
module and a temporary config folder (a Hydra search path), is taken by the registry, the config check and
training, with its hash in run.json, and no other edit. (A folder of files needs no module: textdir,
tests/data/test_streams.py.)"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from posenc_lab.data import CORPORA, CORPUS_UNITS, corpus_options, load_corpus
from posenc_lab.rundir import RunDir, corpus_identity
from tests.helpers_train import assert_finished_figures, compose_config, tiny

NAME = "throwaway_counting"
SOURCE = f'''
"""Counting in words, byte level: "1 2 3 ..." up to n, split 90/5/5 by position."""

from pathlib import Path

import numpy as np

from posenc_lab.data import Corpus, register_corpus


@register_corpus("{NAME}", unit="byte")
def load_counting(root: Path, *, n: int = 5000) -> Corpus:
    text = np.frombuffer(" ".join(map(str, range(1, n + 1))).encode(), dtype=np.uint8)
    a, b = int(0.9 * len(text)), int(0.95 * len(text))
    return Corpus("{NAME}", text[:a], text[a:b], text[b:], vocab_size=256)
'''
YAML = f"""# Counting in words, byte level (a drop-in test corpus).
defaults:
  - default
name: {NAME}
corpus:
  n: 5000
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The module imported (so registered) and conf/data/<name>.yaml in a search-path folder."""
    root = tmp_path_factory.mktemp("new_corpus")
    module = root / f"{NAME}.py"
    module.write_text(SOURCE)
    (root / "conf" / "data").mkdir(parents=True)
    (root / "conf" / "data" / f"{NAME}.yaml").write_text(YAML)
    spec = importlib.util.spec_from_file_location(f"_test_corpus_{NAME}", module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield f"hydra.searchpath=[file://{root / 'conf'}]"
    CORPORA.pop(NAME, None)
    CORPUS_UNITS.pop(NAME, None)
    sys.modules.pop(spec.name, None)


def test_the_registry_and_the_config_take_it(corpus):
    assert corpus_options(NAME) == ["n"] and CORPUS_UNITS[NAME] == "byte"
    cfg = compose_config("train", [f"data={NAME}", "run_dir=x", corpus])
    assert (cfg.data.name, cfg.data.corpus.n, cfg.data.segment_len) == (NAME, 5000, 128)  # the base's keys
    with pytest.raises(ValueError, match=rf"corpus '{NAME}' takes no option size .*its options: n"):
        load_corpus(NAME, size=3)


def test_it_trains_and_run_json_records_its_hash(corpus, tmp_path):
    run = tmp_path / "run"
    results = train_tiny(run, tmp_path / "cache", corpus)
    assert results["data"] == NAME and results["metric"] == "bpb"
    assert_finished_figures(results)
    assert RunDir(run).identity()["corpus"] == corpus_identity(load_corpus(NAME, n=5000))


def train_tiny(run, cache, corpus):
    from posenc_lab.train import train  # torch and Lightning load when the test runs, not at collection

    return train(compose_config("train", tiny(run, cache, corpus, steps=2, data=NAME)))
