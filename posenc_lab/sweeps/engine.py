"""The thin adapter to wandb's sweep engine (the ``sweeps`` library on PyPI, what wandb's server runs).

``propose(spec, trials, seed)`` returns the next trial's parameters (None when a grid is done) from the sweep
file's ``method``/``metric``/``parameters`` and the trials so far, their metrics fed back; ``to_stop(spec,
trials)`` names the running trials that ``early_terminate`` (hyperband) stops. A trial here is the record of
the sweep state (state.py): ``{"id", "params", "state", "history": [[step, value], ...], "metric"}``.

The engine draws from numpy's and Python's global random generators: each call runs under a seed of its own
(the sweep's seed and the number of trials so far), so the same sweep and the same metrics propose the same
trial, and a resumed sweep proposes what the uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

with warnings.catch_warnings():  # sweeps 0.2 declares pydantic v1-style models: v2 warns on import, harmlessly
    warnings.simplefilter("ignore")
    import sweeps as wandb_sweeps
    from sweeps import RunState, SweepRun

ENGINE_KEYS = ("method", "metric", "parameters", "early_terminate")
# our trial states -> the engine's: a stopped trial is finished with the metric it reached; an interrupted one
# is running (it continues on the next invocation)
RUN_STATES = {
    "finished": RunState.finished,
    "stopped": RunState.finished,
    "failed": RunState.failed,
    "running": RunState.running,
    "interrupted": RunState.running,
}


class EngineError(ValueError):
    """The engine rejects the sweep config (its own JSON schema) or cannot propose."""


def engine_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a sweep file the engine reads."""
    return {k: spec[k] for k in ENGINE_KEYS if k in spec}


def validate(spec: dict[str, Any]) -> None:
    """EngineError naming what wandb's schema rejects in the sweep file (e.g. hyperband without min_iter)."""
    try:
        with _quiet():
            wandb_sweeps.SweepConfig(engine_config(spec))
    except Exception as e:  # noqa: BLE001 - jsonschema's ValidationError and the library's ValueErrors
        raise EngineError(f"wandb's sweep engine rejects it: {str(e).splitlines()[0]}") from None


def plain(value: Any) -> Any:
    """numpy scalars (what the engine samples) as Python numbers, for JSON and for Hydra overrides."""
    return value.item() if isinstance(value, np.generic) else value


def sweep_run(trial: dict[str, Any], metric: str) -> SweepRun:
    """A trial as the engine sees a wandb run: config, state, per-validation history and summary."""
    history = [{metric: value} for _, value in trial.get("history", [])]
    summary = {metric: trial["metric"]} if trial.get("metric") is not None else {}
    # by alias: with pydantic v2 the library's field names are ignored (its allow_population_by_field_name is v1)
    return SweepRun(
        name=trial["id"],
        state=RUN_STATES[trial["state"]],
        config={k: {"value": v} for k, v in trial["params"].items()},
        sampledHistory=history,
        summaryMetrics=summary,
    )


def propose(spec: dict[str, Any], trials: list[dict[str, Any]], seed: int) -> tuple[dict[str, Any], dict] | None:
    """(parameters, the engine's search info) of the next trial, or None when a grid has no trial left."""
    config = engine_config(spec)
    runs = [sweep_run(t, spec["metric"]["name"]) for t in trials]
    with _quiet(), _seeded(seed + len(trials)):
        suggestion = wandb_sweeps.next_run(config, runs, validate=True)
    if suggestion is None:
        return None
    # in the sweep file's order, as the agent's ${args_no_hyphens}
    params = {k: plain(suggestion.config[k]["value"]) for k in spec["parameters"] if k in suggestion.config}
    info = {k: plain(v) for k, v in (suggestion.search_info or {}).items() if k != "warnings"}
    info = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in info.items()}
    return params, info


def to_stop(spec: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """Ids of the running trials the sweep's early_terminate stops now (none without one)."""
    if not spec.get("early_terminate"):
        return []
    runs = [sweep_run(t, spec["metric"]["name"]) for t in trials if t["state"] != "interrupted"]
    with _quiet():
        return [r.name for r in wandb_sweeps.stop_runs(engine_config(spec), runs)]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The engine's scikit-learn fits warn about kernel bounds on a handful of points: expected, not news."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """numpy's and Python's global generators seeded for the block, and restored after."""
    np_state, py_state = np.random.get_state(), random.getstate()
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
