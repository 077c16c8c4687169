"""Evaluation (posenc_lab/evaluate.py): outputs named by every setting, by run and
checkpoint, never outside their folder, rewritten whole; the corpus compared with the run's.

Evaluation output names: no option value names another folder, and the device and the precision are in
the name when they change the figures, while the names of a CPU fp32 evaluation stay those of before."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from posenc_lab import evaluate
from posenc_lab.errors import ConfigError, deliberate
from posenc_lab.evaluate import OtherCorpusError, evaluate_checkpoint, evaluate_main, output_dir, output_name
from posenc_lab.io import inside, safe_name
from posenc_lab.rundir import RunDir
from posenc_lab.train import train
from tests.helpers_train import compose_config, run_train, tiny

# the settings of one evaluation, as evaluate_checkpoint returns them
RESULT = {
    "split": "test",
    "train_steps": 4,
    "segment_len": 16,
    "mem_len": 16,
    "same_length": False,
    "episode_len": None,
    "batch_size": 4,
    "max_batches": 2,
    "scheme_options": {"clamp_len": 12},
    "precision": "32-true",
    "device": "cpu",
}


def test_a_cpu_fp32_evaluation_keeps_todays_name_and_a_gpu_or_another_precision_gets_its_own():
    assert output_name(RESULT) == "test_step4_L16_M16_Tnone_B4_first2_clamp_len12"
    before_devices = {k: v for k, v in RESULT.items() if k != "device"}  # a result of an earlier version
    assert output_name(before_devices) == output_name(RESULT)
    names = {
        output_name({**RESULT, "device": device, "precision": precision})
        for device in ("cpu", "cuda")
        for precision in ("32-true", "bf16-mixed", "16-mixed")
    }
    assert len(names) == 6
    assert output_name({**RESULT, "device": "cuda", "precision": "bf16-mixed"}) == (
        "test_step4_L16_M16_Tnone_B4_first2_clamp_len12_bf16-mixed_cuda"
    )


@pytest.mark.parametrize(
    "value",
    ["x/../../../../tmp/evil/ABS", "..", "/etc/passwd", "a\\b", "x" * 300, "", "a b\nc"],
    ids=["traversal", "dotdot", "absolute", "backslash", "long", "empty", "whitespace"],
)
def test_an_option_value_never_names_another_folder(tmp_path, value):
    name = output_name({**RESULT, "scheme_options": {"share_uv": value}})
    assert "/" not in name and "\\" not in name and len(name.encode()) <= 200
    assert inside(tmp_path, f"{name}.json").parent == tmp_path
    assert name != output_name({**RESULT, "scheme_options": {"share_uv": value + "/"}})  # two values, two names
    key_name = output_name({**RESULT, "scheme_options": {value: 1}})
    assert "/" not in key_name and inside(tmp_path, f"{key_name}.json").parent == tmp_path


def test_safe_name_keeps_plain_values_and_tells_apart_the_ones_it_changes():
    assert [safe_name(v) for v in ("yarn", 4.0, -1, True, None, "1e-3")] == [
        "yarn",
        "4.0",
        "-1",
        "True",
        "None",
        "1e-3",
    ]
    changed = {safe_name(v) for v in ("a/b", "a-b", "a b", "a\\b")}
    assert len(changed) == 4 and "a-b" in changed
    assert safe_name("..") != ".." and safe_name("") != ""
    for bad in ("a/b", "..", "../x", ""):
        with pytest.raises(ValueError, match="would leave its folder"):
            inside("/some/folder", bad)


def test_eval_with_a_traversal_in_an_option_writes_nothing_outside_its_folder(tmp_path, finished):
    """The probe's '+posenc.share_uv=x/../../../../tmp/evil/ABS' wrote /tmp/evil/ABS.json. The value may be refused
    as no bool (the schemes' type checks); written, it lies in the evaluation's own folder."""
    run = tmp_path / "copy" / "run"
    shutil.copytree(finished, run)
    out = output_dir(run / "checkpoints" / "last.ckpt", None)
    hops = os.path.relpath(tmp_path, out)  # from the output folder up to tmp_path
    evil = f"x/../{hops}/evil/ABS"
    assert os.path.normpath(out / f"{evil}.json") == str(tmp_path / "evil" / "ABS.json")
    cfg = compose_config(
        "eval",
        [f"ckpt={run / 'checkpoints' / 'last.ckpt'}", "progress_bar=false", "accelerator=cpu", "max_batches=1",
         f"+posenc.share_uv={evil}"],
    )  # fmt: skip
    try:
        evaluate_main(cfg)
    except ValueError as e:  # refused by the scheme's option types: fine, nothing written either
        assert "share_uv" in str(e)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "x").exists()
    written = [p for p in run.rglob("*.json") if p.parent == out]
    assert all(p.parent == out and "/" not in p.stem for p in written)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and run not in p.parents]
    assert outside == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a CUDA and a CPU evaluation of one run")
def test_a_cuda_and_a_cpu_evaluation_of_one_checkpoint_do_not_overwrite_each_other(tmp_path, finished):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    for accelerator in ("cpu", "cuda"):
        evaluate_main(
            compose_config(
                "eval", [f"ckpt={ckpt}", "progress_bar=false", f"accelerator={accelerator}", "max_batches=2"]
            )
        )
    files = {p.stem: json.loads(p.read_text()) for p in output_dir(ckpt, None).glob("*.json")}
    assert sorted(files) == ["test_step4_L16_M16_Tnone_B4_first2", "test_step4_L16_M16_Tnone_B4_first2_cuda"]
    cpu, cuda = files["test_step4_L16_M16_Tnone_B4_first2"], files["test_step4_L16_M16_Tnone_B4_first2_cuda"]
    assert (cpu["device"], cuda["device"]) == ("cpu", "cuda") and cpu["tokens"] == cuda["tokens"]
    assert cuda["loss"] == pytest.approx(cpu["loss"], rel=1e-3)


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
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())  # the runs' mirrors (rundir.run_folder)
    assert len(folders) == 2 and all(f.startswith("run-") for f in folders)  # a folder per run, same folder name
    of_a = output_dir(a / "checkpoints" / "last.ckpt", tmp_path).parent
    in_a = sorted(str(p.relative_to(of_a)) for p in of_a.rglob("*.json"))
    assert in_a == [f"{c}/test_step{s}_L16_M16_Tnone_B4_first2.json" for c, s in (("good", 1), ("last", 2))]
    results = [json.loads(p.read_text()) for p in tmp_path.glob("runs/*/eval/last/*.json")]
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
    with pytest.raises(
        ConfigError, match=r"out_dir=.*afile/runs/run-[0-9a-f]{8}/eval/last: .*afile is a file, not a folder"
    ):
        evaluate_cli(run / "checkpoints" / "last.ckpt", f"out_dir={tmp_path / 'afile'}")
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_learned_overflow_advice_is_an_option_eval_takes(tmp_path, cache):
    from posenc_lab.evaluate import evaluate_main
    from tests.helpers_train import compose_config as compose

    run_train(tmp_path / "run", cache, "posenc=learned", "posenc.max_positions=16", steps=2)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=r"posenc\.overflow=clamp") as info:
        evaluate_checkpoint(ckpt, segment_len=32, max_batches=1)
    assert deliberate(info.value)
    # The advice, as typed on the command line, is taken by `posenc-lab eval`.
    cfg = compose(
        "eval",
        [
            f"ckpt={ckpt}",
            "data.segment_len=32",
            "posenc.overflow=clamp",
            "max_batches=1",
            "progress_bar=false",
            f"out_dir={tmp_path / 'eval'}",
            "accelerator=cpu",
        ],
    )
    evaluate_main(cfg)
    (written,) = output_dir(ckpt, tmp_path / "eval").glob("*.json")
    result = json.loads(written.read_text())
    assert result["scheme_options"] == {"overflow": "clamp"} and math.isfinite(result["loss"])
    assert "overflowclamp" in written.name


def test_eval_outputs_are_named_by_every_setting_and_rewritten_whole(tmp_path, finished):
    from posenc_lab.evaluate import evaluate_main
    from tests.helpers_train import compose_config as compose

    def evaluate(*overrides):
        cfg = compose(
            "eval",
            [
                f"ckpt={finished / 'checkpoints' / 'last.ckpt'}",
                "progress_bar=false",
                "accelerator=cpu",
                f"out_dir={tmp_path}",
                "dump_losses=true",
                *overrides,
            ],
        )
        evaluate_main(cfg)

    evaluate("max_batches=2")
    evaluate("max_batches=3")
    evaluate("max_batches=2", "data.episode_len=32")
    evaluate("max_batches=2", "data.batch_size=2")
    out = output_dir(finished / "checkpoints" / "last.ckpt", tmp_path)  # a folder per run and checkpoint
    names = sorted(p.stem for p in out.glob("*.json"))
    assert names == [
        "test_step4_L16_M16_T32_B4_first2",
        "test_step4_L16_M16_Tnone_B2_first2",
        "test_step4_L16_M16_Tnone_B4_first2",
        "test_step4_L16_M16_Tnone_B4_first3",
    ]
    with pytest.raises(ConfigError, match=r"max_batches must be an integer >= 1 .*null: all.*got 0"):
        evaluate("max_batches=0")
    first = json.loads((out / "test_step4_L16_M16_Tnone_B4_first2.json").read_text())
    assert output_name({**first, "precision": "bf16-mixed"}) == "test_step4_L16_M16_Tnone_B4_first2_bf16-mixed"
    assert output_name({**first, "data_overrides": {"corpus": {"eval_max_distance": 60}}}).startswith(
        "test_step4_L16_M16_Tnone_B4_first2_data-"
    )

    # A truncated output (e.g. a full disk under another tool) is written whole by the next eval.
    target = out / "test_step4_L16_M16_Tnone_B4_first2"
    target.with_suffix(".json").write_text('{"loss": ')
    target.with_suffix(".npz").write_bytes(target.with_suffix(".npz").read_bytes()[:100])
    evaluate("max_batches=2")
    assert math.isfinite(json.loads(target.with_suffix(".json").read_text())["loss"])
    from posenc_lab.io import load_npz

    assert load_npz(target.with_suffix(".npz"))["token_loss"].shape == (4, 2 * 16)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
