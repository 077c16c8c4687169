"""Evaluations that know their run (issue 23): outputs named by run and checkpoint, the corpus compared with
the run's run.json, out_dir checked before the compute."""

from __future__ import annotations

import json
import math

import pytest

from posenc_lab import evaluate
from posenc_lab.errors import ConfigError
from posenc_lab.evaluate import OtherCorpusError, evaluate_main, output_dir
from posenc_lab.rundir import RunDir
from posenc_lab.train import train
from tests.helpers_train import compose_config, tiny

TEXT = bytes(range(97, 123)) * 400  # 10.4 kB of a-z


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs (seeds 0 and 1) on one text file, both in a folder named "run": {seed: run dir}, the file."""
    tmp = tmp_path_factory.mktemp("eval-runs")
    text = tmp / "corpus.txt"
    text.write_bytes(TEXT)
    out = {}
    for seed in (0, 1):
        run = tmp / f"seed{seed}" / "run"
        args = (f"seed={seed}", f"data.corpus.path={text}", "checkpoint_every=1")
        train(compose_config("train", tiny(run, tmp / "cache", *args, data="textfile", steps=2)))
        out[seed] = run
    return out, text


def evaluate_cli(ckpt, *overrides):
    evaluate_main(compose_config("eval", [f"ckpt={ckpt}", "progress_bar=false", "accelerator=cpu", "max_batches=2",
                                          *overrides]))  # fmt: skip


def test_evals_of_two_runs_or_two_checkpoints_into_one_out_dir_never_overwrite_each_other(runs, tmp_path):
    a, b = runs[0][0], runs[0][1]
    for ckpt in (a / "checkpoints" / "last.ckpt", a / "checkpoints" / "good.ckpt", b / "checkpoints" / "last.ckpt"):
        evaluate_cli(ckpt, f"out_dir={tmp_path}")
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and all(f.startswith("run-") for f in folders)  # a folder per run, same folder name
    of_a = output_dir(a / "checkpoints" / "last.ckpt", tmp_path).parent
    in_a = sorted(str(p.relative_to(of_a)) for p in of_a.rglob("*.json"))
    assert in_a == [f"{c}/test_step{s}_L16_M16_Tnone_B4_first2.json" for c, s in (("good", 1), ("last", 2))]
    results = [json.loads(p.read_text()) for p in tmp_path.glob("*/last/*.json")]
    assert sorted(r["checkpoint"] for r in results) == sorted(str(r / "checkpoints" / "last.ckpt") for r in (a, b))
    assert results[0]["loss"] != results[1]["loss"]  # two runs, two figures, both kept
    # without out_dir: the run's own eval/ folder
    evaluate_cli(a / "checkpoints" / "last.ckpt")
    assert (a / "eval" / "last" / "test_step2_L16_M16_Tnone_B4_first2.json").is_file()


def test_a_changed_corpus_is_refused_naming_both_hashes_unless_allowed(runs, tmp_path):
    run, text = runs[0][0], runs[1]
    ckpt = run / "checkpoints" / "last.ckpt"
    recorded = RunDir(run).identity()["corpus"]["sha256"]
    evaluate_cli(ckpt, f"out_dir={tmp_path / 'same'}")
    (same,) = (tmp_path / "same").rglob("*.json")
    result = json.loads(same.read_text())
    assert result["corpus_sha256"] == result["run_corpus_sha256"] == recorded and result["other_corpus"] is False

    text.write_bytes(bytes(range(65, 91)) * 400)  # the same length, other bytes
    try:
        with pytest.raises(OtherCorpusError, match=rf"records sha256 {recorded}, the corpus now gives [0-9a-f]{{64}}"):
            evaluate_cli(ckpt, f"out_dir={tmp_path / 'changed'}")
        assert not (tmp_path / "changed").exists()  # refused before anything was written
        evaluate_cli(ckpt, f"out_dir={tmp_path / 'changed'}", "allow_other_corpus=true")
        (written,) = (tmp_path / "changed").rglob("*.json")
        result = json.loads(written.read_text())
        assert result["other_corpus"] is True and result["run_corpus_sha256"] == recorded
        assert result["corpus_sha256"] != recorded and "_other-corpus-" in written.name
        assert math.isfinite(result["loss"])
    finally:
        text.write_bytes(TEXT)


def test_out_dir_is_checked_before_the_compute(runs, tmp_path, monkeypatch):
    run = runs[0][0]
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **k: pytest.fail("computed before the check"))
    with pytest.raises(ConfigError, match=r"out_dir=.*afile/run-[0-9a-f]{8}/last: .*afile is a file, not a folder"):
        evaluate_cli(run / "checkpoints" / "last.ckpt", f"out_dir={tmp_path / 'afile'}")
    assert (tmp_path / "afile").read_text() == "not a folder"
