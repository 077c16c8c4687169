"""The posenc-lab command line (train / eval / bench / plugins) and evaluate_checkpoint."""

from __future__ import annotations

import json
import shutil
import sys
from importlib.metadata import EntryPoint

import numpy as np
import pytest

from posenc_lab import cli
from posenc_lab.checkpoints import CheckpointError
from posenc_lab.evaluate import evaluate_checkpoint, load_config, load_model, output_dir
from posenc_lab.model import MemoryTransformer
from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, run_module, subprocess_env, tiny
from tests.schemes import NOPE, ROPE, XL

CALLS = []


def fake_command(argv):
    CALLS.append(list(argv))
    return 0


def posenc_lab_command() -> list[str]:
    """The installed console script, else the same entry point through python -m."""
    script = shutil.which("posenc-lab")
    return [script] if script else [sys.executable, "-m", "posenc_lab.cli"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny recall run: (run dir, results)."""
    tmp = tmp_path_factory.mktemp("trained")
    results = train(compose_config("train", tiny(tmp / "run", tmp / "cache", "final_eval.limit_batches=1.0", steps=6)))
    return tmp / "run", results


def test_help_lists_builtin_and_plugin_commands(monkeypatch, capsys):
    plugin = EntryPoint(name="hello", value="tests.test_cli:fake_command", group=cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [plugin] if group == cli.ENTRY_POINT_GROUP else [])
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "eval", "bench", "hello"):
        assert f"  {name} " in out
    CALLS.clear()
    assert cli.main(["hello", "a=1", "--flag"]) == 0
    assert CALLS == [["a=1", "--flag"]]
    assert cli.main(["nosuch"]) == 2
    assert "unknown command 'nosuch'" in capsys.readouterr().err


def test_bench_is_dispatched_lazily(monkeypatch):
    import posenc_lab.bench as bench

    CALLS.clear()
    monkeypatch.setattr(bench, "main", fake_command)
    assert cli.main(["bench", "--quick"]) == 0
    assert CALLS == [["--quick"]]


def test_evaluate_checkpoint_at_other_lengths(trained):
    run, results = trained
    ckpt = run / "checkpoints" / "last.ckpt"
    # the training figures are reproduced exactly by evaluating at the training settings
    same = evaluate_checkpoint(ckpt, split="test")
    assert same["loss"] == pytest.approx(results["test"]["loss"], rel=1e-9)
    assert (same["segment_len"], same["mem_len"], same["train_steps"]) == (16, 16, 6)

    longer = evaluate_checkpoint(
        ckpt, segment_len=32, mem_len=64, same_length=True, max_batches=5, return_token_losses=True
    )
    assert (longer["segment_len"], longer["mem_len"], longer["same_length"]) == (32, 64, True)
    arrays = longer["token_losses"]
    for name in ("token_loss", "targets", "loss_mask", "distance", "correct", "position"):
        assert arrays[name].shape == (4, 5 * 32), name
    assert arrays["stream_start"].tolist() == [0, 749, 1498, 2247]  # (3000 - 1) // 4 tokens per stream
    scored = arrays["loss_mask"]
    assert arrays["token_loss"][scored].mean() == pytest.approx(longer["loss"], rel=1e-5)
    assert (arrays["distance"][scored] > 0).all()

    no_memory = evaluate_checkpoint(ckpt, segment_len=8, mem_len=0, split="val", max_batches=3)
    assert no_memory["mem_len"] == 0 and np.isfinite(no_memory["loss"])


def test_load_model_and_config(trained):
    run, _ = trained
    model = load_model(run / "checkpoints" / "last.ckpt")
    assert isinstance(model, MemoryTransformer) and not model.training
    assert model.cfg.posenc == XL and model.cfg.mem_len == 16
    cfg = load_config(run / "checkpoints" / "last.ckpt")
    assert cfg.data.name == "recall" and cfg.posenc.name == XL


def test_evaluate_bad_inputs(trained, tmp_path):
    run, _ = trained
    ckpt = run / "checkpoints" / "last.ckpt"
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt.ckpt cannot be read"):
        evaluate_checkpoint(corrupt)
    with pytest.raises(ValueError, match="same_length=true needs mem_len"):
        evaluate_checkpoint(ckpt, mem_len=0, same_length=True)
    with pytest.raises(ValueError, match="split"):
        evaluate_checkpoint(ckpt, split="train")


def test_learned_cannot_be_evaluated_past_its_table(tmp_path):
    train(
        compose_config(
            "train", tiny(tmp_path / "run", tmp_path / "cache", "posenc=learned", "posenc.max_positions=16", steps=2)
        )
    )
    with pytest.raises(ValueError, match="cannot evaluate .* max_positions=16"):
        evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", segment_len=32)


def _console(*args: str) -> str:
    """Run ``posenc-lab ARGS`` as a user types it; its standard output."""
    import subprocess

    proc = subprocess.run(
        [*posenc_lab_command(), *args], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_console_train(tmp_path):
    """`posenc-lab train ...` end to end, as a user types it."""
    _console("train", *tiny(tmp_path / "run", tmp_path / "cache", steps=3))  # run_dir= moves Hydra's output too
    run = tmp_path / "run"
    assert (run / ".hydra" / "config.yaml").exists() and (run / "config.yaml").exists()
    assert json.loads((run / "results.json").read_text())["steps"] == 3


def test_console_train_bf16_mixed_with_clipping_in_a_fresh_run_dir(tmp_path):
    """bf16-mixed with gradient clipping trains (the fused AdamW cannot be clipped under Lightning's mixed
    precision: the foreach one is used), and the precision warning this CPU may log before the run-dir
    checks, which creates train.log, does not make the fresh folder look like another's."""
    run = tmp_path / "run"
    _console("train", *tiny(run, tmp_path / "cache", "trainer.precision=bf16-mixed", "bf16_check=warn", steps=2))
    assert json.loads((run / "results.json").read_text())["steps"] == 2
    assert float(compose_config("train")["trainer"]["gradient_clip_val"]) > 0  # the case Lightning refuses


def test_console_eval(trained, tmp_path):
    run, _ = trained
    printed = _console(
        "eval",
        f"ckpt={run / 'checkpoints' / 'last.ckpt'}",
        "data.segment_len=32",
        "model.mem_len=32",
        "model.same_length=true",
        "dump_losses=true",
        "max_batches=4",
        "progress_bar=false",
        f"out_dir={tmp_path}",
    )
    written = output_dir(run / "checkpoints" / "last.ckpt", tmp_path) / "test_step6_L32_M32_same_Tnone_B4_first4"
    out = json.loads(written.with_suffix(".json").read_text())
    assert out["segment_len"] == 32 and out["same_length"] is True and "loss" in out
    (name,) = {"bpb", "bpc", "ppl"} & set(out)  # the corpus's own figure, which the console line gives too
    assert f'"{name}": {json.dumps(out[name])}' in printed
    assert np.load(written.with_suffix(".npz"))["token_loss"].shape == (4, 4 * 32)


def _hydra_app_fails(main, argv, monkeypatch, capsys) -> str:
    """Run a Hydra app in this process as the console would; return what it printed on failing."""
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.setattr(sys, "argv", ["posenc-lab", *argv])
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        GlobalHydra.instance().clear()
    assert exit_info.value.code != 0
    return capsys.readouterr().err


def test_cli_errors_are_clear(tmp_path, monkeypatch, capsys):
    from posenc_lab import evaluate
    from posenc_lab import train as train_module

    err = _hydra_app_fails(train_module.main, ["nosuchkey=1", f"hydra.run.dir={tmp_path}"], monkeypatch, capsys)
    assert "nosuchkey is not a key of `posenc-lab train`" in err and "checkpoint_every" in err
    err = _hydra_app_fails(train_module.main, ["posenc=nosuch", f"hydra.run.dir={tmp_path}"], monkeypatch, capsys)
    assert "posenc=nosuch is not an option of posenc" in err and ROPE in err  # lists the available options
    err = _hydra_app_fails(evaluate.main, [f"ckpt={tmp_path / 'missing.ckpt'}"], monkeypatch, capsys)
    assert "missing.ckpt: no such file" in err


@pytest.mark.slow
def test_multirun_sweep(tmp_path):
    args = [a for a in tiny(tmp_path / "x", tmp_path / "cache", steps=2) if not a.startswith("run_dir=")]
    proc = run_module("posenc_lab.train", "-m", f"posenc={XL},{NOPE}", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(json.loads(p.read_text())["scheme"] for p in (tmp_path / "sweep").glob("*/results.json"))
    assert results == sorted([NOPE, XL])
