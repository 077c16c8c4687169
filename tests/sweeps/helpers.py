"""What the sweep tests share (tests/sweeps/test_run.py, test_sweeps.py): the sweep file a test writes, the
environment of a trial process, the state a sweep folder holds, and the offline wandb run a trial leaves."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


def sweep_file(tmp_path: Path, base: str = "ablation_recall.yaml", name: str = "test.yaml", **changes) -> Path:
    """The sweep file ``sweeps/<base>`` with the top-level keys ``changes`` replaced, written to tmp_path/name."""
    spec = yaml.safe_load((REPO / "sweeps" / base).read_text())
    spec.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sweep_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `python -m posenc_lab...` child: the repository importable, one thread, a corpus cache
    under tmp_path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["POSENC_LAB_CACHE"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def state_of(out: Path) -> dict:
    """A sweep folder's state as one record: its section of grid.json (sweep_id, seed, ...) and its trials in the
    order they were proposed."""
    data = json.loads((out / "grid.json").read_text())
    return {**data["sweep"], "trials": list(data["trials"].values())}


def read_wandb_records(path: Path) -> list:
    """The protobuf records of an offline run file (run-ID.wandb): a W&B header, then LevelDB-log
    style records (crc32c, length, type) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, out, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def wandb_run_summary(run_dir: Path) -> dict:
    """run settings, config keys, history keys and values of the one offline wandb run under run_dir."""
    files = list(run_dir.rglob("run-*.wandb"))
    assert len(files) == 1, files
    info: dict = {"history": {}, "config": {}}
    for r in read_wandb_records(files[0]):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            info.update(group=r.run.run_group, tags=list(r.run.tags), job_type=r.run.job_type, run_id=r.run.run_id)
            info["name"] = r.run.display_name
            for item in r.run.config.update:
                info["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in r.config.update:
                info["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":  # items are leaves: key, or nested_key [top, sub, ...] of a logged media dict
            row: dict = {}
            for item in r.history.item:
                path = [item.key] if item.key else list(item.nested_key)
                node = row
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = json.loads(item.value_json)
            for key, value in row.items():
                info["history"].setdefault(key, []).append(value)
    return info
