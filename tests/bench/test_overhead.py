"""posenc_lab/bench/overhead.py: the bare loop is the fit step without the framework (same batches, same weights,
same update), the clock's window holds the steps asked for, rounds combine paired, bad options are one line. No
figure is asserted: the benchmark prints them."""

from __future__ import annotations

import pytest
import torch

from posenc_lab import bench
from posenc_lab.bench import overhead
from posenc_lab.compose import compose
from tests.helpers_train import CONF_DIR, CORPUS

WARMUP, STEPS = 1, 3


def _cfg(tmp_path, *extras):
    run = tmp_path / "run"
    data = ["data=pystdlib", f"data.root={tmp_path.parent / 'cache'}", *CORPUS["pystdlib"], "data.batch_size=4"]
    extra = [*data, "data.segment_len=16", "model.mem_len=16", "trainer.enable_model_summary=false", "bf16_check=off"]
    extra += extras
    return compose("train", overhead.overrides("tiny", WARMUP, STEPS, str(run), extra), conf_dir=CONF_DIR)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_bare_loop_takes_the_fit_steps_losses(tmp_path, precision):
    # same initial weights, batches, clipping, AdamW and schedule: every step's loss equal to the real fit's, so
    # fit - bare is the framework alone (a bare loop without the clipping, the schedule or autocast drifts)
    cfg = _cfg(tmp_path, "optim.warmup_steps=1", "trainer.gradient_clip_val=0.05", f"trainer.precision={precision}")
    _, _, bare = overhead.time_bare(cfg, WARMUP, STEPS, torch.device("cpu"), keep_losses=True)
    _, _, clock = overhead.time_fit(cfg, WARMUP, STEPS, keep_losses=True)
    assert len(bare) == WARMUP + STEPS and len(clock.losses) == WARMUP + STEPS + 1
    torch.testing.assert_close(torch.stack(bare), torch.stack(clock.losses[: len(bare)]), rtol=1e-5, atol=1e-6)
    assert len({round(float(x), 4) for x in bare}) > 1  # the weights moved: the updates were compared too
    # the window: from the start of batch WARMUP to the start of batch WARMUP + STEPS, every batch started once
    assert clock.starts == WARMUP + STEPS + 1 and len(clock.marks) == 2
    assert clock.marks[1][0] > clock.marks[0][0]


def test_window_settings_keep_validation_and_checkpoints_out(tmp_path):
    cfg = _cfg(tmp_path)
    total = WARMUP + STEPS + 1
    assert cfg.trainer.max_steps == total and cfg.trainer.num_sanity_val_steps == 0
    assert cfg.trainer.val_check_interval > total and cfg.checkpoint_every > total
    assert cfg.model.n_layer == 2  # model=tiny
    assert cfg.trainer.enable_progress_bar  # the command's own progress bar stays in the step


def test_rounds_combine_to_medians_with_the_overhead_spread_paired():
    rows = [
        {"config": "tiny", "scheme": "xl", "bare_ms": b, "fit_ms": f, "overhead_ms": f - b, "tokens_per_step": 64}
        for b, f in ((10.0, 13.0), (20.0, 21.0), (11.0, 16.0))
    ]
    rows.append({"config": "small", "scheme": "xl", "bare_ms": 100.0, "fit_ms": 104.0, "overhead_ms": 4.0})
    tiny, small = overhead.combine(rows)
    assert (tiny["config"], tiny["rounds"], small["rounds"]) == ("tiny", 3, 1)
    assert tiny["bare_ms"] == 11.0 and tiny["fit_ms"] == 16.0  # medians of each figure
    # the overhead is each round's own difference: its median is 3, not 16 - 11 = 5 of the medians
    assert (tiny["overhead_ms"], tiny["overhead_ms_min"], tiny["overhead_ms_max"]) == (3.0, 1.0, 5.0)
    assert tiny["tokens_per_step"] == 64 and small["overhead_ms_min"] == small["overhead_ms_max"] == 4.0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--configs", "tiny,huge"], "--configs huge (valid: "),
        (["--steps", "0"], "--steps 0 (at least 1)"),
        (["model=base"], "'model=base' (model is --configs)"),
        (["posenc=nosuch"], "nosuch"),  # Hydra's own refusal, in one line
        (["data.batch_size=0"], "data.batch_size"),  # a value posenc-lab train refuses
        (["trainer.precision=16-mixed"], "trainer.precision=16-mixed: the bare loop runs"),
    ],
)
def test_bad_options_are_one_line_before_any_step(argv, named, capsys):
    assert bench.main(["overhead", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_command_prints_both_loops_and_their_difference(tmp_path, capsys):
    data = ["data=pystdlib", f"data.root={tmp_path / 'cache'}", *CORPUS["pystdlib"], "data.batch_size=4"]
    argv = ["overhead", "--configs", "tiny", "--rounds", "1", "--warmup", "1", "--steps", "2", *data]
    assert bench.main([*argv, "data.segment_len=16", "model.mem_len=16"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("config=tiny"))
    fields = dict(item.split("=", 1) for item in row.split())
    bare, fit, diff = (float(fields[k].replace(",", "")) for k in ("bare_ms", "fit_ms", "overhead_ms"))
    assert diff == pytest.approx(fit - bare, abs=1.01)  # printed to 2 places, or whole ms from 100 on
    assert fields["tokens_per_step"] == "64"  # 4 streams x 16 tokens: the overrides reached the run
