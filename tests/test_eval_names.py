"""Evaluation output names (issue 27): no option value names another folder, and the device and the precision are in
the name when they change the figures, while the names of a CPU fp32 evaluation stay those of before."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from posenc_lab.evaluate import evaluate_main, output_dir, output_name
from posenc_lab.io import inside, safe_name
from tests.helpers_train import compose_config

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
