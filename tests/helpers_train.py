"""Shared by tests/test_lit.py, test_cli.py, test_configs.py, test_ddp.py: compose the real conf/
and train tiny models in seconds."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest

from posenc_lab.checkpoints import read_checkpoint
from posenc_lab.compose import compose
from posenc_lab.train import train

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


def compose_config(config_name: str = "train", overrides: list[str] | tuple[str, ...] = ()):
    """Compose the repository's real config, as the command line does (posenc_lab.compose)."""
    return compose(config_name, overrides, conf_dir=CONF_DIR)


# Small corpora: a recall probe of 20k tokens (D up to 40 in every split, whatever a preset evaluates: 3,000
# evaluation tokens hold few items of D up to 400), 200 kB of the standard library.
CORPUS = {
    "recall": [
        "data.corpus.train_tokens=20000",
        "data.corpus.eval_tokens=3000",
        "data.corpus.max_distance=40",
        "data.corpus.eval_max_distance=40",
    ],
    "pystdlib": ["data.corpus.max_bytes=200000"],
}


def tiny(run_dir, cache, *extra: str, steps: int = 4, data: str = "recall") -> list[str]:
    """Overrides for a few-second run: tiny model, a small corpus, no progress bar."""
    return [
        f"run_dir={run_dir}",
        f"data={data}",
        f"data.root={cache}",
        *CORPUS.get(data, []),
        "model=tiny",
        "data.segment_len=16",
        "data.batch_size=4",
        "model.mem_len=16",
        f"trainer.max_steps={steps}",
        "trainer.val_check_interval=1000",
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "final_eval.limit_batches=3",
        "optim.warmup_steps=2",
        *extra,
    ]


def assert_finished_figures(results: dict) -> None:
    """A finished run's val and test figures: a finite loss above 0 over scored tokens, and the corpus's figure
    (results["metric"]: bpb, bpc or ppl) that loss in its unit, so NaN or a figure of another loss fails."""
    for split in ("val", "test"):
        figures = results[split]
        loss = figures["loss"]
        assert math.isfinite(loss) and loss > 0 and figures["tokens"] > 0, (split, figures)
        expect = math.exp(loss) if results["metric"] == "ppl" else loss / math.log(2)
        assert figures[results["metric"]] == pytest.approx(expect, rel=1e-5), (split, figures)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for `python -m posenc_lab...` children: the repo importable, one thread each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_module(module: str, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class LossRecorder(L.Callback):
    """Writes every training step's (global step, loss, tokens) to <path>/rank<r>.json at the end."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append(
            {
                "step": trainer.global_step,
                "loss": float(outputs["loss"]),
                "tokens": batch["tokens"].tolist(),
                "reset": bool(batch["reset"]),
            }
        )

    def on_train_end(self, trainer, pl_module):
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.steps))


def recorded(path, rank: int = 0) -> list[dict]:
    return json.loads((Path(path) / f"rank{rank}.json").read_text())


def record(path) -> list[str]:
    """Overrides that add a LossRecorder writing to ``path``."""
    return ["+callbacks.record._target_=tests.helpers_train.LossRecorder", f"+callbacks.record.path={path}"]


def run_train(run_dir, cache, *extra, steps=4, data="recall"):
    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps, data=data)))


@pytest.fixture(autouse=True)
def no_stale_log_handlers():
    """Log handlers an earlier in-process Hydra command left on the root logger, writing to a stream pytest has
    closed since, would print "--- Logging error ---" tracebacks into this test's stderr: drop them."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)


def step_of(path) -> int:
    return int(read_checkpoint(path)["global_step"])


def cli(main, argv, monkeypatch, capsys) -> tuple[int, str]:
    """Run a Hydra command's main() in this process as the console does: (exit status, stderr); 0 if it returns.
    The log handlers Hydra adds (a file in the run directory, which the test may remove) are taken off again."""
    from hydra.core.global_hydra import GlobalHydra

    root, handlers = logging.getLogger(), list(logging.getLogger().handlers)
    monkeypatch.setattr(sys, "argv", ["posenc-lab", *map(str, argv)])
    status = 0
    try:
        main()
    except SystemExit as e:
        status = e.code
    finally:
        GlobalHydra.instance().clear()
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
    return status, capsys.readouterr().err


class SignalAt(L.Callback):
    """Sends ``signum`` to this process during training step ``step`` (0-based global step)."""

    def __init__(self, step: int, signum: str):
        self.step, self.signum = int(step), getattr(signal, signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def signal_at(step: int, signum: str = "SIGTERM") -> list[str]:
    return [
        "+callbacks.signal._target_=tests.helpers_train.SignalAt",
        f"+callbacks.signal.step={step}",
        f"+callbacks.signal.signum={signum}",
    ]
