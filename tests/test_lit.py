"""LitLM + SegmentDataModule + train(): exact resume, memory handling, metrics, errors."""

from __future__ import annotations

import json
import math

import lightning as L
import pytest
import torch

from posenc_lab.checkpoints import CheckpointError, read_checkpoint
from posenc_lab.lit import LitLM, NonFiniteLossError
from posenc_lab.metrics import EvalStats, logged_metrics
from posenc_lab.optim import warmup_cosine
from posenc_lab.train import train
from tests.helpers_train import compose_config, record, recorded, tiny
from tests.schemes import FOX, LEARNED, PATH, STICKBREAKING, XL


def test_warmup_cosine_schedule():
    f = [warmup_cosine(s, warmup_steps=10, total_steps=110, min_lr_ratio=0.1) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.55)
    assert f[110] == pytest.approx(0.1) and f[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


RESUME_AT, RESUME_STEPS = 4, 8
RESUME_COMMON = [
    "model.dropout=0.1",
    f"checkpoint_every={RESUME_AT}",
    "callbacks.checkpoint.save_top_k=-1",
    "trainer.val_check_interval=3",
]


def resume_is_exact(tmp_path, cache, *extra: str) -> dict:
    """Interrupt after step 4 of 8 and resume from that checkpoint: steps 5..8 must be those of the run that never
    stopped (dropout on, validation interleaved, the data position and the memory carried across the cut). The
    check can tell: resumed without the saved memory, step 5's loss differs. Returns the step-4 checkpoint."""
    common = [*RESUME_COMMON, *extra]

    def run(name: str, *more: str, steps: int = RESUME_STEPS) -> list[dict]:
        overrides = tiny(tmp_path / name, cache, *common, *more, *record(tmp_path / f"rec_{name}"), steps=steps)
        train(compose_config("train", overrides))
        return recorded(tmp_path / f"rec_{name}")

    before = run("full")
    assert len(before) == RESUME_STEPS
    ckpt = tmp_path / "full" / "checkpoints" / f"step{RESUME_AT:07d}.ckpt"
    after = run("resumed", f"resume={ckpt}")
    assert [s["step"] for s in after] == list(range(RESUME_AT + 1, RESUME_STEPS + 1))
    assert [s["tokens"] for s in after] == [s["tokens"] for s in before[RESUME_AT:]]  # data position
    assert not any(s["reset"] for s in after)  # so the memory matters
    for x, y in zip(before[RESUME_AT:], after):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6, rel=0)

    state = read_checkpoint(ckpt)
    forgetful = {**state, "posenc_lab": {**state["posenc_lab"], "train_mems": []}}
    torch.save(forgetful, tmp_path / "no_mem.ckpt")
    no_mem = run("no_mem", f"resume={tmp_path / 'no_mem.ckpt'}", steps=RESUME_AT + 1)
    assert no_mem[0]["loss"] != pytest.approx(before[RESUME_AT]["loss"], abs=1e-6, rel=0)
    return state


def test_resume_gives_the_same_next_losses(tmp_path, cache):
    state = resume_is_exact(tmp_path, cache)
    assert state["global_step"] == RESUME_AT
    mems = state["posenc_lab"]["train_mems"]
    assert len(mems) == 2 and mems[0].shape == (4, 16, 64)  # n_layer x [B, mem_len, d_model]
    assert state["SegmentDataModule"]["train"]["batch"] == RESUME_AT


@pytest.mark.parametrize("name", [FOX, STICKBREAKING, PATH])
def test_the_data_dependent_schemes_resume_exactly(tmp_path, cache, name):
    """Their gates and transforms of memory positions come from the memory's hidden states, which the
    checkpoint carries as it carries any scheme's memory."""
    resume_is_exact(tmp_path, cache, f"posenc={name}")


def test_auto_resume_from_the_run_dir(tmp_path, cache):
    run = tmp_path / "run"
    first = train(compose_config("train", tiny(run, cache, steps=3)))
    assert first["resumed_from"] is None and first["steps"] == 3
    again = train(compose_config("train", tiny(run, cache, steps=5)))  # same run dir, longer: continues
    assert again["resumed_from"] == str(run / "checkpoints" / "last.ckpt") and again["steps"] == 5
    assert (run / "metrics.until_step3.csv").exists() and (run / "metrics.csv").exists()


def test_run_dir_layout_and_results(tmp_path, cache):
    run = tmp_path / "run"
    results = train(compose_config("train", tiny(run, cache, steps=3)))
    for name in ("config.yaml", "metrics.csv", "hparams.yaml", "results.json", "checkpoints/last.ckpt"):
        assert (run / name).exists(), name
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    for key in ("scheme", "data", "steps", "tokens", "wall_time_s", "mem_len", "segment_len", "params", "val", "test"):
        assert key in on_disk
    assert on_disk["scheme"] == XL and on_disk["steps"] == 3 and on_disk["tokens"] == 3 * 4 * 16
    for split in ("val", "test"):
        figures = on_disk[split]
        assert math.isfinite(figures["loss"]) and figures["ppl"] == pytest.approx(math.exp(figures["loss"]), rel=1e-5)
        assert 0.0 <= figures["acc"] <= 1.0 and figures["acc_by_distance"]
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    for col in ("train/loss", "train/ppl", "train/lr", "train/tokens_per_s", "train/acc", "val/loss", "val/acc"):
        assert col in header, col


def test_byte_corpus_logs_bits_per_token(tmp_path, cache):
    results = train(compose_config("train", tiny(tmp_path / "run", cache, steps=2, data="pystdlib")))
    assert results["metric"] == "bpb" and "acc" not in results["val"]
    assert results["val"]["bpb"] == pytest.approx(results["val"]["loss"] / math.log(2))


def _batch(reset=False, B=2, L=3, V=10, distance=None):
    return {
        "tokens": torch.randint(0, V, (B, L)),
        "targets": torch.randint(0, V, (B, L)),
        "loss_mask": torch.ones(B, L, dtype=torch.bool),
        "offset": torch.zeros(B, dtype=torch.long),
        "reset": torch.tensor(reset),
        "distance": torch.full((B, L), -1) if distance is None else distance,
    }


def test_memory_is_kept_per_split_and_dropped_on_reset():
    lit = LitLM(model=dict(vocab_size=10, n_layer=1, d_model=16, n_head=2, d_inner=32, mem_len=4, dropout=0.0))
    lit.forward_segment(_batch(True), "train")
    memory = lit.memory["train"].memory  # static: always mem_len slots, the valid ones a suffix
    assert memory.states[0].shape == (2, 4, 16) and memory.valid.tolist() == [False, True, True, True]
    assert lit.memory["val"].memory is None
    lit.forward_segment(_batch(False), "train")
    memory = lit.memory["train"].memory
    assert memory.states[0].shape == (2, 4, 16) and memory.valid.all()  # filled up to mem_len
    assert not memory.states[0].requires_grad
    lit.forward_segment(_batch(True), "train")  # reset: memory dropped first
    assert lit.memory["train"].memory.valid.tolist() == [False, True, True, True]


def test_evaluation_lengths_go_to_the_forward_pass_not_into_the_model():
    lit = LitLM(model=dict(vocab_size=10, n_layer=1, d_model=16, n_head=2, d_inner=32, mem_len=4, dropout=0.0))
    lit.evaluate_at(mem_len=2, same_length=True)
    for _ in range(3):
        lit.forward_segment(_batch(), "val")
        lit.forward_segment(_batch(), "train")
    assert lit.memory["val"].memory.states[0].shape == (2, 2, 16)
    assert lit.memory["train"].memory.states[0].shape == (2, 4, 16)
    assert lit.model.mem_len == 4 and not lit.model.same_length  # the model is as trained
    with pytest.raises(ValueError, match="same_length=true needs mem_len >= 1"):
        lit.evaluate_at(mem_len=0, same_length=True)


def test_eval_stats_pool_tokens_and_bucket_answers():
    stats = EvalStats([1, 8])
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    scored = torch.tensor([[True, True, False], [True, True, True]])
    distance = torch.tensor([[-1, 3, 9], [12, -1, 2]])
    correct = torch.tensor([[False, True, True], [False, True, True]])
    stats.update(loss, scored, distance, correct)
    stats.update(torch.full((1, 3), 10.0), torch.ones(1, 3, dtype=torch.bool), torch.full((1, 3), -1), None)
    r = stats.compute()
    assert r["tokens"] == 8 and r["loss"] == pytest.approx((1 + 2 + 4 + 5 + 6 + 30) / 8)  # pooled, not per batch
    # answers: d=3 (right), d=12 (wrong), d=2 (right); d=9 is not scored
    assert r["answers"] == 3 and r["acc"] == pytest.approx(2 / 3)
    assert r["acc_by_distance"] == {"1-7": 1.0, "8+": 0.0}
    stats.reset()
    stats.update(loss, scored, torch.full((2, 3), -1), None)  # no answers: no accuracy, no argmax needed
    assert "acc" not in stats.compute() and stats.compute()["tokens"] == 5


def test_logged_metric_names_are_what_training_logs(tmp_path, cache):
    """posenc_lab.metrics.logged_metrics (which the sweep checker asks) lists every key a run logs."""
    run = tmp_path / "run"
    train(compose_config("train", tiny(run, cache, steps=3)))
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    logged = {k for k in header if "/" in k}
    names = logged_metrics("word", answers=True)  # tiny() trains on recall (words, with answers)
    assert logged and logged <= names, logged - names
    assert {"val/loss", "val/ppl", "test/acc", "train/loss"} <= logged


def test_no_weight_decay_on_embeddings_norms_biases_and_positional_tables():
    lit = LitLM(
        model=dict(
            vocab_size=10,
            n_layer=1,
            d_model=16,
            n_head=2,
            d_inner=32,
            posenc=LEARNED,
            posenc_kwargs={"max_positions": 8},
        )
    )
    lit.trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False)
    groups = lit.configure_optimizers()["optimizer"].param_groups
    decayed = {id(p) for p in groups[0]["params"]}
    names = {id(p): n for n, p in lit.model.named_parameters()}
    assert groups[0]["weight_decay"] > 0 and groups[1]["weight_decay"] == 0
    assert all(names[i].endswith("weight") and ".ln" not in names[i] for i in decayed)
    for name, p in lit.model.named_parameters():
        if name.startswith(("embedding", "scheme")) or ".ln_" in name or name.endswith("bias"):
            assert id(p) not in decayed, name


class _Poison(L.Callback):
    """Puts an inf into the weights before step 3."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 3:
            with torch.no_grad():
                pl_module.model.embedding.weight[0, 0] = float("inf")


def test_non_finite_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, cache):
    cfg = compose_config(
        "train",
        tiny(
            tmp_path / "run", cache, "checkpoint_every=2", "+callbacks.poison._target_=tests.test_lit._Poison", steps=6
        ),
    )
    with pytest.raises(NonFiniteLossError, match=r"at step 3 \(batch index 3\).*good\.ckpt"):
        train(cfg)
    good = read_checkpoint(tmp_path / "run" / "checkpoints" / "good.ckpt")
    assert good["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in good["state_dict"].values() if v.is_floating_point())


def test_bad_inputs_fail_before_training(tmp_path, cache):
    def run(*extra):
        return train(compose_config("train", tiny(tmp_path / "bad", cache, *extra)))

    with pytest.raises(ValueError, match="unknown positional scheme 'nosuch'"):
        run("posenc.name=nosuch")
    with pytest.raises(FileNotFoundError, match="no file at"):
        train(
            compose_config(
                "train", tiny(tmp_path / "bad", cache, f"data.corpus.path={tmp_path / 'missing.txt'}", data="textfile")
            )
        )
    with pytest.raises(ValueError, match="episode_len"):
        run("data.episode_len=8")  # shorter than a segment
    with pytest.raises(ValueError, match="max_positions"):
        run("posenc=learned", "posenc.max_positions=8")  # segments of 16 tokens
    with pytest.raises(ValueError, match="same_length"):
        run("model.same_length=true", "model.mem_len=0")
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_corrupt_or_mismatched_checkpoint_is_named(tmp_path, cache):
    bad = tmp_path / "corrupt.ckpt"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt.ckpt cannot be read"):
        train(compose_config("train", tiny(tmp_path / "a", cache, f"resume={bad}")))
    with pytest.raises(CheckpointError, match="no such file"):
        train(compose_config("train", tiny(tmp_path / "a", cache, f"resume={tmp_path / 'nope.ckpt'}")))

    train(compose_config("train", tiny(tmp_path / "b", cache, steps=2)))
    ckpt = tmp_path / "b" / "checkpoints" / "last.ckpt"
    with pytest.raises(CheckpointError, match=r"last.ckpt was trained with another model: d_model"):
        train(compose_config("train", tiny(tmp_path / "c", cache, f"resume={ckpt}", "model.d_model=32")))
    with pytest.raises(CheckpointError, match=r"last.ckpt was trained on other data settings.*n_streams"):
        train(compose_config("train", tiny(tmp_path / "c", cache, f"resume={ckpt}", "data.batch_size=8")))


# ---- extending a run keeps its learning-rate schedule ------------------------------------------------


def _lr(ckpt) -> float:
    return read_checkpoint(ckpt)["optimizer_states"][0]["param_groups"][0]["lr"]


def test_a_longer_max_steps_keeps_the_schedule_says_so_and_results_record_every_stretch(tmp_path, cache, caplog):
    run, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.ckpt"
    first = train(compose_config("train", tiny(run, cache, steps=4)))  # warm-up 2, cosine to step 4, lr 1e-3
    assert first["schedule"] == [
        {"from_step": 0, "to_step": 4, "lr": 1e-3, "warmup_steps": 2, "total_steps": 4, "min_lr_ratio": 0.1}
    ]
    with caplog.at_level("WARNING", logger="posenc_lab.optim"):
        longer = train(compose_config("train", tiny(run, cache, steps=6)))
    assert "trainer.max_steps=6 runs past the end of this run's learning-rate schedule, which is kept" in caplog.text
    assert "For a new cosine to step 6 instead: optim.total_steps=6" in caplog.text
    assert [(s["from_step"], s["to_step"], s["total_steps"]) for s in longer["schedule"]] == [(0, 4, 4), (4, 6, 4)]
    assert _lr(last) == pytest.approx(1e-4)  # at the floor; a cosine stretched to step 6 would be at 3.25e-4

    # a new cosine, asked for: optim.total_steps may change (it is not part of the run's identity)
    newer = train(compose_config("train", tiny(run, cache, "optim.total_steps=12", steps=10)))
    assert [(s["from_step"], s["to_step"], s["total_steps"]) for s in newer["schedule"]][-1] == (6, 10, 12)
    assert _lr(last) == pytest.approx(1e-3 * warmup_cosine(10, 2, 12, 0.1))
    assert json.loads((run / "results.json").read_text())["schedule"] == newer["schedule"]


def test_a_checkpoint_without_its_schedule_is_refused_in_one_line(tmp_path, cache, finished):
    """A checkpoint of a development version (no schedule in its posenc_lab entry): named, not resumed."""
    old = read_checkpoint(finished / "checkpoints" / "last.ckpt")
    del old["posenc_lab"]["schedule"]
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match=r"development version of posenc-lab .*lacks schedule\); train the run again"):
        train(compose_config("train", tiny(tmp_path / "new", cache, f"resume={tmp_path / 'old.ckpt'}", steps=6)))


def test_a_step_seed_gives_torch_manual_seeds_noise_without_formatting_a_stack(monkeypatch):
    """torch.manual_seed queues a seed, with traceback.format_stack() (a file stat per frame), for each device kind
    not initialised (CUDA, XPU, MTIA): a millisecond of every CPU step. seed_step gives the same noise without it."""
    import traceback

    from posenc_lab.lit import seed_step

    torch.manual_seed(1234)
    expected = torch.get_rng_state()
    torch.manual_seed(0)

    def refuse(*args, **kwargs):
        raise AssertionError("a stack formatted to seed a step")

    monkeypatch.setattr(traceback, "format_stack", refuse)
    seed_step(1234, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), expected)
    if not torch.cuda.is_initialized():  # what the step did before: the guard above would have caught it
        with pytest.raises(AssertionError, match="a stack formatted"):
            torch.manual_seed(1234)


def test_the_finite_check_keeps_the_first_bad_loss_across_folds(monkeypatch):
    """The losses wait on the host side until the check (or WATCH_FOLD of them): the first non-finite one, its step
    and batch index are kept on the device, whatever follows."""
    lit = LitLM(model=dict(vocab_size=10, n_layer=1, d_model=16, n_head=2, d_inner=32, dropout=0.0))
    monkeypatch.setattr(LitLM, "WATCH_FOLD", 3)
    for i, loss in enumerate([1.0, 2.0, 3.0, 4.0, float("nan")]):  # a fold at 3 (all finite), then 2 kept
        lit._watch_finite(torch.tensor(loss), i)
    assert len(lit._watched) == 2 and torch.isinf(lit._first_bad[0])  # folded: none bad yet
    for i, loss in enumerate([float("inf"), 7.0], start=5):
        lit._watch_finite(torch.tensor(loss), i)
    lit._fold_watched()
    step, batch_idx, loss = lit._first_bad.tolist()
    assert (step, batch_idx, math.isnan(loss)) == (0, 4, True)  # the nan at batch 4, not the inf after it
    lit._watch_finite(torch.tensor(float("inf")), 9)
    lit._fold_watched()
    assert lit._first_bad[1].item() == 4  # kept until a check reads it


def test_the_progress_bar_draws_once_a_step_and_gathers_figures_when_new_ones_are_logged(monkeypatch):
    import io

    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    from posenc_lab.lit import LoggedStepBar

    gathered = []
    monkeypatch.setattr(TQDMProgressBar, "get_metrics", lambda self, trainer, module: gathered.append(1) or {})
    bar = LoggedStepBar()
    bar.train_progress_bar = Tqdm(total=10, file=io.StringIO())
    draws = []
    monkeypatch.setattr(bar.train_progress_bar, "refresh", lambda *a, **k: draws.append(1))
    module = L.LightningModule()
    module.shown = {"train/loss": 2.5}
    for i in range(3):
        bar.on_train_batch_end(None, module, None, None, i)
    assert len(draws) == 3 and len(gathered) == 1 and bar.train_progress_bar.n == 3
    assert bar.train_progress_bar.postfix.endswith("train/loss=2.500")
    module.shown = {"train/loss": 1.5}  # a logged step
    bar.on_train_batch_end(None, module, None, None, 3)
    assert len(draws) == 4 and len(gathered) == 2 and "train/loss=1.500" in bar.train_progress_bar.postfix
