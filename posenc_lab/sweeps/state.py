"""A sweep's state: the grid's one state file, ``<out>/grid.json`` (``posenc_lab.grid.Ledger``), rewritten
atomically after every change. Its section ``sweep``:

    sweep_id (8 characters, as wandb's), seed (the engine's, see engine.py), sweep_file, sweep (the file's parsed
    content), overrides (the extra ones), created

and each trial's entry: what the grid records of every trial (status, wall_s, cpu_s, attempts, updated, run_dir,
overrides) and what the sweep adds,

    id, number, params, state (running | finished | stopped | failed | interrupted), log, history [[step, value],
    ...] (the metric at each validation), metric (the objective: the final value), steps, stopped_at, returncode,
    error, search_info (the engine's proposal state, bayes), started, ended

``state`` is the trial as the engine and the table see it; ``status`` is its last process's (the grid's): a trial
hyperband stopped early is ``state`` stopped and ``status`` trained (its process ended well), one a signal stopped
is ``state`` interrupted and ``status`` stopped.

A rerun of the same command into the same --out continues it: finished, stopped and failed trials are kept
(and the engine sees them), interrupted ones run again first and resume from their checkpoints. A rerun with
another sweep file or other overrides is refused, naming the difference. The folder of an earlier version, whose
state is ``sweep.json``, is read as it is and written as grid.json at the first save, which removes sweep.json and
says so in one line.
"""

from __future__ import annotations

import datetime
import secrets
import string
from pathlib import Path
from typing import Any

from ..grid import Ledger, ledger_file
from ..io import CorruptFileError, read_json
from ..rundir import differences
from .spec import SweepError

SECTION = "sweep"  # the sweep's section of grid.json
LEGACY_FILE, LEGACY_FORMAT = "sweep.json", 1  # the state of an earlier version: its own file
# the grid's status of a trial of sweep.json, by its state
LEGACY_STATUS = {"finished": "trained", "stopped": "trained", "failed": "failed", "interrupted": "stopped"}
DONE = ("finished", "stopped", "failed")  # trials a rerun keeps
_ID_CHARS = string.ascii_lowercase + string.digits


def new_id() -> str:
    """An id shaped like wandb's run and sweep ids."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


class SweepState:
    """The state of one sweep in ``out`` (``ledger``: its grid.json); ``save()`` after every change. ``legacy``: the
    sweep.json it was read from, removed at the first save."""

    def __init__(self, out: Path, ledger: Ledger, legacy: Path | None = None):
        self.out, self.ledger, self.legacy = Path(out), ledger, legacy

    @property
    def data(self) -> dict[str, Any]:
        return self.ledger.sections[SECTION]

    @property
    def path(self) -> Path:
        return self.ledger.path

    @property
    def sweep_id(self) -> str:
        return self.data["sweep_id"]

    @property
    def seed(self) -> int:
        return int(self.data["seed"])

    @property
    def trials(self) -> list[dict[str, Any]]:
        return list(self.ledger.recorded.values())

    def count(self, *states: str) -> int:
        return sum(t["state"] in states for t in self.trials)

    def trial(self, trial_id: str) -> dict[str, Any]:
        return self.ledger.recorded[trial_id]

    def add_trial(self, params: dict[str, Any], search_info: dict | None) -> dict[str, Any]:
        trial_id = new_id()
        while trial_id in self.ledger.recorded:
            trial_id = new_id()
        trial = {
            "id": trial_id,
            "number": len(self.ledger.recorded),
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
        self.ledger.recorded[trial_id] = trial
        return trial

    def save(self) -> None:
        self.ledger.write()
        if self.legacy is not None:
            self.legacy.unlink(missing_ok=True)
            print(f"posenc-lab sweep: {self.legacy} (an earlier version's state) is now {self.path}", flush=True)
            self.legacy = None

    @classmethod
    def open(cls, out: Path, sweep_file: Path, spec: dict[str, Any], overrides: list[str]) -> SweepState:
        """The sweep in ``out`` (new if there is none; read from an earlier version's sweep.json if that is all
        there is); SweepError if it is another sweep, or not a sweep's. Nothing is written here."""
        out = Path(out)
        remedy = f"delete {out} to start the sweep over, or use another --out"
        legacy = out / LEGACY_FILE
        try:
            ledger = Ledger(ledger_file(out), remedy=remedy)
            if not ledger.path.exists() and legacy.exists():
                _read_legacy(ledger, read_json(legacy, remedy=remedy), legacy)
            else:
                legacy = None
        except CorruptFileError as e:
            raise SweepError(str(e)) from None
        if ledger.path.exists() and SECTION not in ledger.sections:
            raise SweepError(f"{ledger.path} is not a posenc-lab sweep's state (another grid's); use another --out")
        if SECTION not in ledger.sections:
            ledger.sections[SECTION] = {
                "sweep_id": new_id(),
                "seed": secrets.randbelow(2**31),
                "sweep_file": str(Path(sweep_file).resolve()),
                "sweep": spec,
                "overrides": list(overrides),
                "created": now(),
            }
            return cls(out, ledger)
        data = ledger.sections[SECTION]
        diff = differences(data["sweep"], spec, "sweep file")
        if list(data["overrides"]) != list(overrides):
            then, now_ = " ".join(data["overrides"]) or "(none)", " ".join(overrides) or "(none)"
            diff.append(f"overrides: then {then}, now {now_}")
        if diff:
            raise SweepError(
                f"{out} holds another sweep ({data['sweep_id']}, {data['sweep_file']}): "
                f"{'; '.join(d.replace(': run ', ': then ') for d in diff)}. Use another --out, or rerun it as it was"
            )
        return cls(out, ledger, legacy)


def _read_legacy(ledger: Ledger, data: Any, path: Path) -> None:
    """An earlier version's sweep.json into ``ledger``: its sweep section and its trials, each with the grid's
    status of its state (its seconds were not measured: None)."""
    if not isinstance(data, dict) or data.get("format") != LEGACY_FORMAT or not isinstance(data.get("trials"), list):
        raise SweepError(f"{path} is not a posenc-lab sweep state; use another --out")
    keys = ("sweep_id", "seed", "sweep_file", "sweep", "overrides", "created")
    ledger.sections[SECTION] = {k: data.get(k) for k in keys}
    for t in data["trials"]:
        status = LEGACY_STATUS.get(t["state"], "running")
        ledger.recorded[t["id"]] = {"status": status, "wall_s": None, "cpu_s": None, **t}
