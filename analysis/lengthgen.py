"""Length generalization on the algorithmic tasks (``posenc_lab.data.lengthgen``): exact-match accuracy per
instance and per answer token, by test length, per run and per cell, with intervals over seeds and instances.

Each test instance is read alone, as training put it: after the end token of the instance before it (packed), or
from a segment's first position (aligned, ``align_to_segment``):

- with memory (M > 0): in segments of the training length L, each layer carrying M states, so an instance
  longer than a segment is read through the memory; the memory first holds the instance before it in the split (of
  the same length, laid out as training lays out instances: ``after_previous``), as in training, where the memory is
  never empty when an instance starts. Read with an empty memory instead, the memory-row pilots' xl copied 8-symbol
  instances with 0.51 of the answer tokens right, and all of them (exact match 1.00) after the previous instance;
- without memory: in one window of the whole instance (the usual length-generalization test, Kazemnejad et al.
  2023, Ruoss et al. 2023): the positions go past those of training, and a scheme that cannot serve them (a
  learned table shorter than the instance, random positions fewer than its keys) is not evaluated, with its
  reason. Aligned, an instance shorter than a segment is read in a window of a segment (``widened``).

An instance is exactly right when every answer token is the model's argmax. Intervals: ``stats.mean_interval``
(seeds, and the instances as units) at ``level``; the verdicts (``conf/lengthgen_paper.yaml``): the same
instances for both cells (paired), ``stats.paired_difference``, Holm over the claims.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from posenc_lab.context import stream_losses
from posenc_lab.data.lengthgen import task_instances

from .runs import Run, cells
from .stats import NOT_EVALUATED, Difference, mean_interval, paired_difference
from .verdicts import holm_steps


@dataclass
class Scored:
    """One run at one test length: ``correct`` [instances, answer tokens] argmax hits, or ``reason`` (not served)."""

    correct: np.ndarray | None
    reason: str = ""

    @property
    def exact(self) -> np.ndarray:
        return self.correct.all(1)


def evaluate(run: Run, split: str, max_instances: int | None = None, lengths=None) -> dict[int, Scored]:
    """Test length n -> the run's hits on the first ``max_instances`` instances of that length (module doc);
    ``lengths``: the lengths to evaluate (None: every test length of the split)."""
    model, out, corpus = run.model(), {}, run.corpus()
    for n, (rows, scored, ids) in task_instances(corpus, split).items():
        if lengths is not None and n not in lengths:
            continue
        rows, scored, ids = rows[:max_instances], scored[:max_instances], {k: a[:max_instances] for k, a in ids.items()}
        if not run.recurrence and corpus.align:
            rows, scored, ids = widened(rows, scored, ids, run.segment_len, corpus.vocab_size - 1)
        if run.recurrence:
            rows, scored, ids = after_previous(rows, scored, ids, corpus.align, corpus.vocab_size - 1)
        segment = run.segment_len if run.recurrence else rows.shape[1] - 1
        torch.manual_seed(0)  # random positions are drawn at evaluation too: the same draws on every report
        try:
            res = stream_losses(
                model,
                rows,
                segment_len=segment,
                mem_len=run.mem_len,
                episode_len=run.episode_len if run.mem_len else None,
                position_ids=ids,
            )
        except ValueError as e:  # the scheme cannot serve this length: checked before any compute
            out[n] = Scored(None, str(e))
            continue
        out[n] = Scored(res.correct.numpy()[scored].reshape(len(rows), -1))
    return out


def after_previous(rows: np.ndarray, scored: np.ndarray, ids: dict, align: int, pad: int):
    """Each instance (rows [k, w], scored [k, w - 1], ids {kind: [k, w]}) after the one before it (the first after the
    last), as training streams them: packed, the previous row (its end token first) then this one without its own
    leading end token; aligned, the previous instance padded to a multiple of ``align`` with ``pad``, then this one
    from a segment's first position. Only this instance's answers are scored."""
    widen = ((0, 0), (0, -rows.shape[1] % align if align else 0))
    cut = 0 if align else 1  # packed: the previous row's end token is this one's leading end token
    joined = np.concatenate([np.pad(np.roll(rows, 1, 0), widen, constant_values=pad), rows[:, cut:]], axis=1)
    ids = {k: np.concatenate([np.pad(np.roll(a, 1, 0), widen), a[:, cut:]], axis=1) for k, a in ids.items()}
    lead = joined.shape[1] - rows.shape[1]
    return joined, np.pad(scored, ((0, 0), (lead, 0))), ids


def widened(rows: np.ndarray, scored: np.ndarray, ids: dict, L: int, pad: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Aligned instances (rows [k, w], scored [k, w - 1], ids {kind: [k, w]}) shorter than a segment, padded on the
    right to L inputs
    (rows [k, L + 1]), as training read them: random positions are drawn for a window's keys (L in training), so a
    narrower window would draw them sparser than training did; causal attention leaves the instance's own
    predictions unchanged by pads after it. Longer instances are returned as they are."""
    extra = L + 1 - rows.shape[1]
    if extra <= 0:
        return rows, scored, ids
    widen = ((0, 0), (0, extra))
    return (
        np.pad(rows, widen, constant_values=pad),
        np.pad(scored, widen),
        {k: np.pad(a, widen) for k, a in ids.items()},
    )


def n_train(scored: dict[int, Scored]) -> int:
    """The training length: the shortest test length (the tests are n_train, 2 n_train, ...)."""
    return min(scored)


@dataclass
class CellLength:
    """One cell at one test length: its seeds' hits stacked, or why it was not evaluated."""

    task: str
    cell: str
    scheme: str
    mem_len: int
    length: int
    factor: int
    exact: np.ndarray | None  # [seeds, instances]
    correct: np.ndarray | None  # [seeds, instances * answer tokens]
    answer_len: int
    reason: str = ""

    @property
    def token_share(self) -> np.ndarray:
        """[seeds, instances]: each instance's share of right answer tokens."""
        return self.correct.reshape(*self.exact.shape, self.answer_len).mean(2)

    def sequence(self, level: float) -> Difference:
        if self.exact is None:
            return NOT_EVALUATED
        return _share(mean_interval(self.exact.astype(np.float64), np.arange(self.exact.shape[1]), level=level))

    def token(self, level: float) -> Difference:
        if self.correct is None:
            return NOT_EVALUATED
        units = np.repeat(np.arange(self.correct.shape[1] // self.answer_len), self.answer_len)
        return _share(mean_interval(self.correct.astype(np.float64), units, level=level))


def _share(d: Difference) -> Difference:
    """An accuracy's interval within [0, 1], where every accuracy lies: a t interval over 2 seeds (about 1 df) can
    reach far past either end, a statement of no accuracy. Clipping keeps its coverage (the true value is inside)."""
    return replace(d, low=min(max(d.low, 0.0), 1.0), high=max(min(d.high, 1.0), 0.0))


def task_cells(runs: list[Run]) -> dict[str, list[Run]]:
    """``<task>/<cell>`` -> its runs (its seeds), the tasks and cells in order."""
    by_task: dict[str, list[Run]] = {}
    for r in runs:
        by_task.setdefault(r.corpus_name, []).append(r)
    return {cell: group for task_runs in by_task.values() for cell, group in cells(task_runs).items()}


def measure(runs: list[Run], split: str, max_instances: int | None, log=print) -> list[CellLength]:
    """Every cell of every task at every test length (tasks, cells and lengths in order)."""
    out = []
    for cell, group in task_cells(runs).items():
        task = group[0].corpus_name
        scored = {}
        for r in group:
            log(f"  lengthgen: {r.label}")
            scored[r.name] = evaluate(r, split, max_instances)
        first = scored[group[0].name]
        base = n_train(first)
        for n in sorted(first):
            per = [scored[r.name][n] for r in group]
            reason = next((s.reason for s in per if s.correct is None), "")
            ok = not reason
            answer = per[0].correct.shape[1] if ok else 0
            out.append(
                CellLength(
                    task,
                    cell,
                    group[0].cell_name.scheme,
                    group[0].mem_len,
                    n,
                    n // base,
                    np.stack([s.exact for s in per]) if ok else None,
                    np.stack([s.correct.reshape(-1) for s in per]) if ok else None,
                    answer,
                    reason,
                )
            )
    return out


def tidy(measured: list[CellLength], level: float) -> pd.DataFrame:
    """One row per task, cell and test length: accuracies with their intervals, or the reason none was measured."""
    rows = []
    for m in measured:
        seq, tok = m.sequence(level), m.token(level)
        rows.append(
            {
                "task": m.task,
                "cell": m.cell,
                "scheme": m.scheme,
                "memory": m.mem_len > 0,
                "length": m.length,
                "factor": m.factor,
                "seeds": 0 if m.exact is None else m.exact.shape[0],
                "instances": 0 if m.exact is None else m.exact.shape[1],
                "seq_acc": seq.estimate,
                "seq_low": seq.low,
                "seq_high": seq.high,
                "token_acc": tok.estimate,
                "token_low": tok.low,
                "token_high": tok.high,
                "not_served": m.reason,
            }
        )
    return pd.DataFrame(rows)


def competence(runs: list[Run], named: set[str], max_instances: int | None, log=print) -> dict[str, float]:
    """The competence gate's measure of each cell in ``named`` (``<task>/<cell>``): exact match per instance on the
    validation split at the training length n_train (in distribution), the mean over the cell's seeds."""
    out: dict[str, float] = {}
    for cell, group in task_cells(runs).items():
        if cell not in named:
            continue
        log(f"  lengthgen: {cell} in distribution (val)")
        shortest = min(task_instances(group[0].corpus(), "val"))
        scored = [evaluate(r, "val", max_instances, lengths={shortest})[shortest] for r in group]
        served = all(s.correct is not None for s in scored)
        out[cell] = float(np.mean([s.exact.mean() for s in scored])) if served else float("nan")
    return out


def estimands(measured: list[CellLength], level: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The papers' own summaries of a cell, past the training length (factors > 1):

    - Ruoss et al. 2023 (Table 1): the accuracy per answer token averaged over the test lengths, each length weighing
      the same (their ``np.mean(accuracies[N+1:])``), per seed; here the mean over seeds with its interval
      (instances the units) and, as their table reports, the best seed. Their test lengths are every length past
      training; here the doubling lengths the split holds.
    - Kazemnejad et al. 2023 (Fig. 3): exact match by length bucket (the table's seq columns), and each cell's rank
      within its task by its exact match averaged over the buckets past training (1: best; ties share the mean rank; a
      cell that cannot serve a length ranks last), then the mean rank over the tasks (their figure's summary).

    (per task and cell, per cell name over tasks)."""
    rows = []
    by_cell: dict[tuple[str, str], list[CellLength]] = {}
    for m in measured:
        if m.factor > 1:
            by_cell.setdefault((m.task, m.cell), []).append(m)
    for (task, cell), ms in by_cell.items():
        row = {"task": task, "cell": cell.split("/", 1)[-1], "lengths": len(ms)}
        if any(m.exact is None for m in ms):
            row.update(
                ruoss=float("nan"), ruoss_low=float("nan"), ruoss_high=float("nan"), ruoss_best_seed=float("nan")
            )
            row["kazemnejad_exact"] = float("nan")
            rows.append(row)
            continue
        # per instance, its share of right answer tokens; every length holds as many instances: equal weights
        per_instance = np.concatenate([m.token_share for m in ms], axis=1)
        d = mean_interval(per_instance, np.arange(per_instance.shape[1]), level=level)
        row.update(ruoss=d.estimate, ruoss_low=max(d.low, 0.0), ruoss_high=min(d.high, 1.0))
        row["ruoss_best_seed"] = float(per_instance.mean(1).max())
        row["kazemnejad_exact"] = float(np.mean([m.exact.mean() for m in ms]))
        rows.append(row)
    per_cell = pd.DataFrame(rows)
    if per_cell.empty:
        return per_cell, pd.DataFrame(columns=["cell", "tasks", "mean_rank"])
    # a cell that cannot serve a length past training ranks below every cell that can (last, ties shared)
    per_cell["rank_in_task"] = per_cell.groupby("task")["kazemnejad_exact"].rank(
        ascending=False, method="average", na_option="bottom"
    )
    ranks = (
        per_cell.groupby("cell", sort=False)["rank_in_task"]
        .agg(tasks="count", mean_rank="mean")
        .reset_index()
        .sort_values("mean_rank", kind="stable")
    )
    return per_cell, ranks


METRICS = ("sequence", "token")
#: a claim's ``factor`` that reads every test length past training, each weighing the same (Ruoss et al.'s average)
PAST = "past"


@dataclass(frozen=True)
class Claim:
    """A verdict fixed in advance (``conf/lengthgen_paper.yaml``): ``better`` has the higher accuracy than
    ``than`` on ``task`` at ``factor`` x n_train, or with ``factor`` ``PAST`` over every test length past training,
    each length weighing the same (Ruoss et al. 2023's average); ``metric``: exact match per instance
    (``sequence``) or accuracy per answer token (``token``, as Ruoss et al. score), the instances the units either
    way (over several lengths, an instance's accuracy per token is its share of right answer tokens)."""

    name: str
    task: str
    better: str
    than: str
    factor: int | str
    source: str
    claim: str
    metric: str = "sequence"

    def values(self, m: CellLength | list[CellLength]) -> tuple[np.ndarray, np.ndarray]:
        """(hits [seeds, scored], units [scored]) of a measured cell under this claim's metric; of several lengths
        (``PAST``): per instance, its exact match or its share of right answer tokens, the lengths side by side."""
        if isinstance(m, list):
            per = [x.exact if self.metric == "sequence" else x.token_share for x in m]
            hits = np.concatenate(per, axis=1).astype(float)
            return hits, np.arange(hits.shape[1])
        if self.metric == "token":
            return m.correct.astype(float), np.repeat(np.arange(m.exact.shape[1]), m.answer_len)
        return m.exact.astype(float), np.arange(m.exact.shape[1])


def judge(
    claims: list[Claim],
    measured: list[CellLength],
    level: float,
    alpha: float,
    in_distribution: dict[str, float] | None = None,
    gate: float | None = None,
) -> pd.DataFrame:
    """Per claim: the difference in its metric's accuracy (better - than) with its interval, its one-sided p, Holm's
    adjusted p over the claims, and the verdict: reproduced (above 0 at alpha), contradicted (below 0 at alpha),
    inconclusive, or not judged (a cell missing, not served, or with one seed; or, with a competence ``gate``, a
    cell whose exact match on validation at n_train, ``in_distribution[<task>/<cell>]`` (``competence``), is below it:
    a model that did not learn the task is not judged on generalizing it)."""
    at = {(m.task, m.cell, m.factor): m for m in measured}
    for m in measured:  # every length past training, for a claim of factor PAST
        if m.factor > 1:
            at.setdefault((m.task, m.cell, PAST), []).append(m)
    rows, ps, diffs, gated = [], [], [], []
    for c in claims:
        a, b = at.get((c.task, f"{c.task}/{c.better}", c.factor)), at.get((c.task, f"{c.task}/{c.than}", c.factor))
        past = {m.factor for x in (a, b) if isinstance(x, list) for m in x}  # PAST: both cells at every such length
        missing = [
            name
            for name, x in ((c.better, a), (c.than, b))
            if x is None
            or any(m.exact is None for m in (x if isinstance(x, list) else [x]))
            or (isinstance(x, list) and {m.factor for m in x} != past)
        ]
        reached = {name: (in_distribution or {}).get(f"{c.task}/{name}", float("nan")) for name in (c.better, c.than)}
        unlearned = (
            []
            if gate is None or in_distribution is None
            else [f"{n} {v:.2f}" for n, v in reached.items() if not v >= gate]
        )
        if missing:
            where = "every length past n_train" if c.factor == PAST else f"{c.factor}x"
            d, why = NOT_EVALUATED, f"not judged: {', '.join(missing)} not measured at {where}"
        elif unlearned:
            d = NOT_EVALUATED
            why = f"not judged: did not learn ({', '.join(unlearned)} exact match in distribution, below {gate:g})"
            gated.append(len(rows))
        else:
            (hits_a, units), (hits_b, _) = c.values(a), c.values(b)
            d = paired_difference(hits_a, hits_b, units, level=level)
            why = "" if d.covers_seeds else "not judged: a cell with one seed"
        p_up, p_down = (d.p_value(">0"), d.p_value("<0")) if not why else (float("nan"), float("nan"))
        ps.append((p_up, p_down))
        diffs.append(d)
        rows.append({"claim": c.name, "task": c.task, "better": c.better, "than": c.than, "factor": c.factor})
        rows[-1]["metric"] = c.metric
        if in_distribution is not None:  # the gate's measure of both cells, shown whether or not they pass
            rows[-1]["in_distribution"] = " / ".join(f"{v:.3f}" for v in reached.values())
        rows[-1].update({"difference": d.text(3), "p": p_up, "note": why, "source": c.source})
    # Holm over both directions of every judged claim at once: any false "reproduced" or "contradicted" at most
    # alpha; each claim's interval at the level of the Holm step that decided it (as conf/paper.yaml's verdicts)
    # A claim the competence gate withheld stays in the family with p = 1 in both directions: the gate can withhold a
    # verdict, never ease another claim's correction.
    judged = [i for i, row in enumerate(rows) if not row["note"]]
    family = [ps[i][0] for i in judged] + [1.0] * len(gated) + [ps[i][1] for i in judged] + [1.0] * len(gated)
    adjusted, steps = holm_steps(family, alpha, corrected=True)
    half = len(judged) + len(gated)
    for row in rows:
        row["p_holm"], row["verdict"] = float("nan"), "not judged"
    for k, i in enumerate(judged):
        up, down, at_level = adjusted[k], adjusted[half + k], 1 - 2 * steps[k]
        rows[i]["p_holm"] = up
        rows[i]["difference"] = f"{diffs[i].at(at_level).text(3)} at {100 * at_level:.1f}%"
        rows[i]["verdict"] = "reproduced" if up < alpha else "contradicted" if down < alpha else "inconclusive"
    return pd.DataFrame(rows)
