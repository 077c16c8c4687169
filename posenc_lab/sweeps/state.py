"""``<out>/sweep.json``: everything a sweep has done, rewritten atomically after every change.

    format, sweep_id (8 characters, as wandb's), seed (the engine's, see engine.py), sweep_file, sweep (the
    file's parsed content), overrides (the extra ones), created, and trials: one record per trial,

        id, number, params, state (running | finished | stopped | failed | interrupted), run_dir, log,
        history [[step, value], ...] (the metric at each validation), metric (the final value), steps,
        stopped_at, returncode, error, search_info (the engine's, bayes), started, ended

A rerun of the same command into the same --out continues it: finished, stopped and failed trials are kept
(and the engine sees them), interrupted ones run again first and resume from their checkpoints. A rerun with
another sweep file or other overrides is refused, naming the difference.
"""

from __future__ import annotations

import datetime
import secrets
import string
from pathlib import Path
from typing import Any

from ..io import read_json, write_json
from ..rundir import differences
from .spec import SweepError

FORMAT = 1
STATE_FILE = "sweep.json"
DONE = ("finished", "stopped", "failed")  # trials a rerun keeps
_ID_CHARS = string.ascii_lowercase + string.digits


def new_id() -> str:
    """An id shaped like wandb's run and sweep ids."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


class SweepState:
    """The state of one sweep in ``out``; ``save()`` after every change."""

    def __init__(self, out: Path, data: dict[str, Any]):
        self.out, self.data = Path(out), data

    @property
    def path(self) -> Path:
        return self.out / STATE_FILE

    @property
    def sweep_id(self) -> str:
        return self.data["sweep_id"]

    @property
    def seed(self) -> int:
        return int(self.data["seed"])

    @property
    def trials(self) -> list[dict[str, Any]]:
        return self.data["trials"]

    def count(self, *states: str) -> int:
        return sum(t["state"] in states for t in self.trials)

    def trial(self, trial_id: str) -> dict[str, Any]:
        return next(t for t in self.trials if t["id"] == trial_id)

    def add_trial(self, params: dict[str, Any], search_info: dict | None) -> dict[str, Any]:
        taken = {t["id"] for t in self.trials}
        trial_id = new_id()
        while trial_id in taken:
            trial_id = new_id()
        trial = {
            "id": trial_id,
            "number": len(self.trials),
            "params": params,
            "state": "running",
            "run_dir": None,
            "log": None,
            "history": [],
            "metric": None,
            "steps": None,
            "stopped_at": None,
            "returncode": None,
            "error": None,
            "search_info": search_info,
            "started": now(),
            "ended": None,
        }
        self.trials.append(trial)
        return trial

    def save(self) -> None:
        write_json(self.path, self.data)

    @classmethod
    def open(cls, out: Path, sweep_file: Path, spec: dict[str, Any], overrides: list[str]) -> SweepState:
        """The sweep in ``out`` (new if there is none); SweepError if it is another sweep."""
        out = Path(out)
        path = out / STATE_FILE
        if not path.exists():
            data = {
                "format": FORMAT,
                "sweep_id": new_id(),
                "seed": secrets.randbelow(2**31),
                "sweep_file": str(Path(sweep_file).resolve()),
                "sweep": spec,
                "overrides": list(overrides),
                "created": now(),
                "trials": [],
            }
            return cls(out, data)
        data = read_json(path, remedy=f"delete {out} to start the sweep over, or use another --out")
        if not isinstance(data, dict) or data.get("format") != FORMAT or "trials" not in data:
            raise SweepError(f"{path} is not a posenc-lab sweep state; use another --out")
        diff = differences(data["sweep"], spec, "sweep file")
        if list(data["overrides"]) != list(overrides):
            then, now_ = " ".join(data["overrides"]) or "(none)", " ".join(overrides) or "(none)"
            diff.append(f"overrides: then {then}, now {now_}")
        if diff:
            raise SweepError(
                f"{out} holds another sweep ({data['sweep_id']}, {data['sweep_file']}): "
                f"{'; '.join(d.replace(': run ', ': then ') for d in diff)}. Use another --out, or rerun it as it was"
            )
        return cls(out, data)
