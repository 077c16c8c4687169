"""Per-cell, per-seed values on shared tokens, one ``verdicts.Evidence`` per measure of conf/paper.yaml.

The measures: ``as_trained`` (the test loss of each run evaluated as trained), ``attention_gain`` (the loss at
the longest evaluated attention length up to 4 L minus at the training one, seed by seed), ``recall_beyond`` (0/1
accuracy of the recall answers beyond one segment), ``horizon_past`` (the change past the training
episodes) and ``context_use`` (what replacing the far context costs: built here, from the losses a
context-perturbation section measures). A cell that cannot be measured is named with its reason, never dropped.
"""

from __future__ import annotations

import numpy as np

from posenc_lab.cellnames import CellName

from .dumps import TokenLosses, same_tokens, stack
from .recall import beyond_segment
from .runs import Run
from .verdicts import Evidence


def restricted(evidence: Evidence, keep: np.ndarray) -> Evidence:
    """The same evidence on the tokens where ``keep`` [tokens] is True."""
    cells = {c: v[:, keep] for c, v in evidence.cells.items()}
    return Evidence(cells, evidence.keys, evidence.documents[keep], evidence.unavailable)


def as_trained(cells: dict[str, list[Run]], dumps: dict[str, TokenLosses]) -> Evidence:
    documents = same_tokens({r.name: dumps[r.name] for g in cells.values() for r in g})
    return Evidence(
        {c: stack([dumps[r.name] for r in g]) for c, g in cells.items()},
        {c: g[0].cell_name for c, g in cells.items()},
        documents,
    )


def attention_gain(cells: dict[str, list[Run]], dumps: dict[str, TokenLosses]) -> Evidence:
    """Loss at the longest context of the dumps up to 4 L minus at each run's training attention length (memory
    cells)."""
    documents = same_tokens({r.name: dumps[r.name] for g in cells.values() for r in g})
    out, keys, unavailable = {}, {}, {}
    for c, g in cells.items():
        if not g[0].recurrence:
            continue
        keys[c] = g[0].cell_name
        d = [dumps[r.name] for r in g]
        # 4 L, the grid's end when this verdict was fixed (the grid now reaches 4 (L + M): the measure
        # stays where it was preregistered)
        L = g[0].segment_len
        longest = max((x for x in d[0].contexts if x <= 4 * L), default=max(d[0].contexts))
        init = g[0].train_attention_length
        if init not in d[0].contexts:
            unavailable[c] = f"its training attention length {init} was not evaluated"
        elif (why := d[0].not_served.get(longest)) is not None:
            unavailable[c] = f"cannot serve attention length {longest}: {why}"
        else:
            out[c] = stack(d, longest) - stack(d, init)
    return Evidence(out, keys, documents, unavailable)


def recall_beyond(cells: dict[str, list[Run]], dumps: dict[str, TokenLosses]) -> Evidence | None:
    """0/1 hits of the answers beyond one segment; None if the cells' segment lengths differ (other answers)."""
    lengths = {g[0].segment_len for g in cells.values()}
    if len(lengths) != 1:
        return None
    first = next(iter(cells.values()))[0]
    d0 = dumps[first.name]
    beyond = beyond_segment(first, d0)
    answered = d0.scored & (d0.distance >= 0)
    documents = d0.units[answered][beyond]
    values = {
        c: np.stack([dumps[r.name].correct[0][answered][beyond].astype(np.float64) for r in g])
        for c, g in cells.items()
    }
    return Evidence(values, {c: g[0].cell_name for c, g in cells.items()}, documents)


def horizon_past(cells: dict[str, list[Run]], tokens: dict) -> Evidence | None:
    """The per-token change past the training episodes (extrapolation's horizon axis), cells trained with
    episodes; None if no cell was."""
    out, keys, unavailable, documents = {}, {}, {}, None
    for c, g in cells.items():
        keys[c] = g[0].cell_name
        parts = [tokens.get((r.name, "horizon_past", r.episode_len)) for r in g]
        if any(p is None for p in parts):
            unavailable[c] = "not trained with episodes (data.episode_len), or the horizon axis could not run"
            continue
        if documents is not None and not np.array_equal(parts[0][1], documents):
            unavailable[c] = "other training episodes than the rest of the group: other tokens"
            continue
        documents = parts[0][1]
        out[c] = np.stack([p[0] for p in parts]).astype(np.float64)
    return None if documents is None else Evidence(out, keys, documents, unavailable)


def context_use(
    true: dict[str, np.ndarray],
    perturbed: dict[str, np.ndarray],
    keys: dict[str, CellName],
    units: np.ndarray,
    unavailable: dict[str, str] | None = None,
) -> Evidence:
    """The measure ``context_use`` of conf/paper.yaml (the verdict ``memory_uses_context_past_span``): per cell and
    seed, each token's loss with the context beyond distance d = L + M replaced by another unit's text minus its
    loss with the true context (above 0: the far text is used). true, perturbed: cell -> [n_seeds, tokens], the
    same seeds in the same order and the same tokens for every cell; units: [tokens]. A context-perturbation
    section returns this from its ``evidence`` as {"context_use": ...}."""
    units = np.asarray(units)
    if set(true) != set(perturbed) or set(true) - set(keys):
        raise ValueError(
            f"context_use: the cells differ: true {sorted(true)}, perturbed {sorted(perturbed)}, named {sorted(keys)}"
        )
    out = {}
    for cell in true:
        a, b = np.asarray(true[cell], np.float64), np.asarray(perturbed[cell], np.float64)
        if a.ndim != 2 or a.shape != b.shape or a.shape[1] != len(units):
            raise ValueError(
                f"context_use: cell {cell}: true and perturbed losses must both be [n_seeds, tokens={len(units)}], "
                f"got {a.shape} and {b.shape}"
            )
        out[cell] = b - a
    unavailable = dict(unavailable or {})  # cells the section could not perturb, with why: named, never dropped
    return Evidence(out, {c: k for c, k in keys.items() if c in out or c in unavailable}, units, unavailable)
