"""Several nodes: two processes started as two nodes of one job on loopback (trainer.num_nodes=2,
trainer.devices=1, gloo), with the environment variables a cluster sets for Lightning's LightningEnvironment
(MASTER_ADDR, MASTER_PORT, NODE_RANK, WORLD_SIZE, LOCAL_RANK: each process is then one rank, Lightning starts
none). Their losses are a one-process run's; a node killed mid-training leaves the other with one line, and
both started again resume and finish with the one-process run's losses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest

from posenc_lab.train import train
from tests.helpers_train import REPO, compose_config, no_stale_log_handlers, step_of, subprocess_env, tiny  # noqa: F401 - autouse fixture

STEPS = 8
COMMON = ("data.batch_size=4", "optim.lr=3e-3", f"optim.total_steps={STEPS}", "checkpoint_every=2")


class StepLog(L.Callback):
    """Appends every training step's (global step, loss) to <path>/rank<r>.jsonl as it ends: what a killed rank
    trained is there too."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "loss": float(outputs["loss"])}) + "\n")


class SlowSteps(L.Callback):
    """Each training step takes ``seconds`` longer: a kill lands between two checkpoints."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


def _losses(folder: Path, rank: int) -> dict[int, float]:
    """step -> loss of a rank (a later line for a step, trained again after a resume, replaces an earlier one)."""
    lines = (folder / f"rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(args: list[str]) -> list[subprocess.Popen]:
    """Both nodes of one job, as a cluster starts them: the same command, the rendezvous in the environment."""
    port = _free_port()
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.pop("RANK", None)  # torchrun's: it would make Lightning take the job for a TorchElastic one
    procs = []
    for node in (0, 1):
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "posenc_lab.train", *args],
                cwd=REPO,
                env={**env, **rendezvous, "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float = 400) -> list[str]:
    """stderr of each node; none may outlive ``timeout`` (no hang)."""
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=timeout)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return errs


@pytest.mark.slow
def test_two_nodes_match_one_process_and_a_lost_node_is_one_line_and_the_run_resumes(tmp_path):
    cache, run, steps_log = tmp_path / "cache", tmp_path / "run", tmp_path / "steps"

    def overrides(run_dir, log, *extra, steps=STEPS):
        step_log = ["+callbacks.steps._target_=tests.test_multinode.StepLog", f"+callbacks.steps.path={log}"]
        return tiny(run_dir, cache, *COMMON, *step_log, *extra, steps=steps)

    single = train(compose_config("train", overrides(tmp_path / "single", tmp_path / "single_steps", "trainer=cpu")))
    one = _losses(tmp_path / "single_steps", 0)
    nodes = ("trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2")

    # node 1 killed after the checkpoint of step 2, while node 0 waits for it in a collective
    slow = ("+callbacks.slow._target_=tests.test_multinode.SlowSteps", "+callbacks.slow.seconds=1")
    procs = _start_nodes(overrides(run, steps_log, *nodes, *slow))
    deadline = time.monotonic() + 400
    while not (run / "checkpoints" / "last.ckpt").is_file():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, _finish(procs, 5)
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    err0, _ = _finish(procs, timeout=120)
    assert time.monotonic() - killed_at < 120 and procs[1].returncode == -signal.SIGKILL
    lines = [line for line in err0.splitlines() if line.startswith("posenc-lab train:")]
    assert procs[0].returncode == 1 and len(lines) == 1 and "Traceback" not in err0, err0[-3000:]
    assert lines[0].startswith("posenc-lab train: error: process 0 of 2 lost another process of this run at step ")
    saved = step_of(run / "checkpoints" / "last.ckpt")
    assert 2 <= saved < STEPS and f"Newest checkpoint: {run / 'checkpoints' / 'last.ckpt'}; " in lines[0]

    # both nodes again, the same command: they resume from the checkpoint and finish
    procs = _start_nodes(overrides(run, steps_log, *nodes))
    errs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == STEPS and results["world_size"] == 2
    assert results["resumed_from"] == str(run / "checkpoints" / "last.ckpt")

    # every step, before the kill and after the resume: rank 0 and rank 1 hold half the global batch each
    rank0, rank1 = _losses(steps_log, 0), _losses(steps_log, 1)
    assert sorted(rank0) == sorted(rank1) == sorted(one) == list(range(1, STEPS + 1))
    for step, loss in one.items():
        assert (rank0[step] + rank1[step]) / 2 == pytest.approx(loss, abs=1e-4), step
    for split in ("val", "test"):
        assert results[split]["loss"] == pytest.approx(single[split]["loss"], abs=1e-4)
    assert not os.path.exists(run / ".lock")
