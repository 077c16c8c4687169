"""The SLURM launcher end to end on a real single-node SLURM (Debian's slurm-wlm and munge): the test
starts munged, slurmctld and slurmd as root with a private configuration in a temporary directory, then
submits a two-job Hydra multirun through hydra/launcher=slurm (submitit); both jobs run as SLURM array
tasks and write their results.json. Skipped, with the reason, where SLURM cannot start.

    apt-get install slurmctld slurmd slurm-client munge    # Debian/Ubuntu, as root
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers_train import subprocess_env, tiny

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(d: Path, munge_socket: Path) -> str:
    """A one-node cluster on this host: no cgroups, no accounting, every path under d."""
    host = socket.gethostname()
    return f"""ClusterName=posenc-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "log" / "slurmctld.log"}
SlurmdLogFile={d / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment (SLURM_CONF) of a running single-node SLURM; stopped after the module."""
    missing = [b for b in DAEMONS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        pytest.skip(
            f"SLURM is not installed ({', '.join(missing)} missing): "
            "apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        pytest.skip("starting slurmd and munged needs root")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install 'posenc-lab[slurm]'")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (d / sub).mkdir(mode=0o700)
    key, munge_socket = d / "munge" / "munge.key", d / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (d / "slurm.conf").write_text(_slurm_conf(d, munge_socket))
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf"), "PATH": f"/usr/sbin:{os.environ['PATH']}"}
    munge = [
        "munged",
        "--foreground",
        "--force",
        f"--socket={munge_socket}",
        f"--key-file={key}",
        f"--log-file={d / 'log' / 'munged.log'}",
        f"--pid-file={d / 'munge' / 'munged.pid'}",
        f"--seed-file={d / 'munge' / 'seed'}",
    ]
    daemons = []
    try:
        for cmd in (munge, ["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            daemons.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.5)
        for _ in range(60):  # the node registers within a few seconds
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if state.strip() == "idle" or any(p.poll() is not None for p in daemons):
                break
            time.sleep(0.5)
        if state.strip() != "idle":
            logs = "".join(p.read_text()[-600:] for p in (d / "log").glob("*.log"))
            pytest.skip(f"SLURM did not start here (node state {state.strip()!r}): {logs}")
        yield env
    finally:
        if len(daemons) == 3:  # cancel what a failed test left running before slurmd goes (no orphaned steps)
            subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
            for _ in range(40):
                if not subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
                    break
                time.sleep(0.5)
        for p in reversed(daemons):
            p.terminate()
        for p in daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow
def test_a_two_job_multirun_runs_as_slurm_array_tasks(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny(sweep, tmp_path / "cache", steps=2) if not o.startswith("run_dir=")]
    cmd = [
        sys.executable,
        "-m",
        "posenc_lab.train",
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        # a CPU node: no GPUs to ask for, one CPU per task (the launcher's defaults are for GPU nodes)
        "hydra.launcher.gpus_per_node=null",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
        "trainer=cpu",
        f"hydra.sweep.dir={sweep}",
        *overrides,
        "posenc=xl,sinusoid",
    ]
    env = subprocess_env(**{k: v for k, v in slurm.items() if k in ("SLURM_CONF", "PATH")})
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert sorted(results) == ["0_xl_recall", "1_sinusoid_recall"], sorted(results)
    assert all(r["steps"] == 2 for r in results.values())
    # each job ran inside SLURM as a task of one array (submitit's folder per task: <array id>_<index>,
    # next to the array's own folder <array id>), and they leave the queue
    tasks = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir() and "_" in p.name)
    assert len(tasks) == 2 and {t.split("_")[1] for t in tasks} == {"0", "1"}, tasks
    assert len({t.split("_")[0] for t in tasks}) == 1, tasks
    for t in tasks:
        assert f"JobEnvironment(job_id={t}," in (sweep / ".submitit" / t / f"{t}_0_log.out").read_text()
        # Lightning saw the SLURM job (its SLURMEnvironment), not a plain process
        assert "SLURM auto-requeueing enabled" in (sweep / ".submitit" / t / f"{t}_0_log.err").read_text()
    for _ in range(60):  # the tasks' results are in before SLURM marks them completed
        queue = subprocess.run(["squeue", "-h"], env=slurm, capture_output=True, text=True).stdout.strip()
        if not queue:
            break
        time.sleep(0.5)
    assert queue == ""
