"""Per-token losses of trained runs on held-out text: the data source of every verdict, of Table 6, of
RECL and of the recall probe. Every run of a group is scored on the same tokens (the paired design of
``stats.paired_difference``), and every token carries its document and its unit of independence (its family
on a corpus split by family, ``Corpus.families``; its document elsewhere): the units of every interval.

Two evaluations:

- ``as_trained``: the split cut into ``n_streams`` streams as the ordered iterator cuts it (stream b is the
  b-th contiguous share of the split, starting an episode), the first ``n_tokens`` targets of each, every
  run with its own segment length, memory and episodes. The streams span the whole split, so the scored
  tokens come from every part of it: the comparison of the runs' own evaluation figures, on more text.
- ``at_contexts``: every scored token sees exactly c previous tokens (``posenc_lab.context.context_losses``:
  memory c with the same-length mask for runs trained with memory, a fresh window of c tokens otherwise),
  for every c of a grid. Rows are evenly spaced over the split. A length the scheme cannot serve is NaN,
  with the scheme's reason.

Each dump is computed once per run and settings and kept as ``<dir>/<run>.npz`` (written atomically; a
dump of other settings or of another checkpoint is computed again; a damaged one is named and recomputed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from posenc_lab.context import context_losses, reads_offsets, stream_losses, stream_rows, window_losses
from posenc_lab.io import CorruptFileError, load_npz, save_npz

from .runs import Run, RunError, grid_segment

# what a dump's ``units`` are; in its meta, so that a dump of before (units: documents) is computed again
UNITS = "family"
# the rules of what a scheme serves; in a controlled-context dump's meta, so that a dump of before is computed again
SERVES = "episodes"
# what an as-trained dump keeps beside the losses; in its meta, so that a dump of before is computed again
KEEPS = "predicted,target"


@dataclass
class AsTrained:
    """Settings of the as-trained evaluation (``ablate.analysis.trained``, ``.recall``; values in conf/ablate.yaml)."""

    n_streams: int
    n_tokens: int  # scored targets per stream


@dataclass(frozen=True)
class AtContexts:
    """Settings of the controlled-context evaluation (c: the attention length, in previous tokens)."""

    contexts: tuple[int, ...]
    split: str
    n_rows: int
    n_score: int  # scored targets per row
    window_max: int | None  # runs without memory: longer windows are not evaluated (None: all)
    window_batch_tokens: int = 32768  # how many window tokens are evaluated at once (memory, not the result)


@dataclass
class ContextSettings:
    """``ablate.analysis.context``: the controlled-context evaluation behind Table 6's attention lengths, RECL and the
    own-baseline truncation curves: c = c_min, c_min + step, ..., coarse_from, then doubling (2 coarse_from,
    4 coarse_from, ...) up to c_max, each coarse c with c - delta beside it (so that RECL's gain g(c - delta, c)
    exists there too), and L, L + M, 2 (L + M) (what the effective-context section reads) with theirs, plus every
    run's training attention length (None: delta = L / 4, step = delta, c_min = delta,
    coarse_from = 2 L, c_max = 4 (L + M), M the longest memory of the group). ``delta``: the gain's g(c, c + delta)
    increment; ``step``: the fine grid's, a divisor of delta; ``n_boot``: the cluster bootstraps' replicates;
    ``fraction``: the own-baseline effective context is the smallest c whose loss is within this fraction of the
    model's own best."""

    n_rows: int
    n_score: int
    delta: int | None
    step: int | None
    c_min: int | None
    coarse_from: int | None  # past this c the grid doubles (None: 2 L)
    c_max: int | None
    window_max: int | None  # runs without memory: no window longer than this (None: c_max, every c of the grid)
    n_boot: int
    fraction: float

    def __post_init__(self):
        if self.n_boot < 50:
            raise ValueError(f"ablate.analysis.context.n_boot must be >= 50 replicates, got {self.n_boot!r}")
        if not 0 < self.fraction < 1:
            raise ValueError(f"ablate.analysis.context.fraction must be in (0, 1), e.g. 0.01, got {self.fraction!r}")

    def gain_delta(self, runs: list[Run]) -> int:
        """delta of the gain g(c, c + delta) (default: L / 4)."""
        return self.delta or max(1, grid_segment(runs) // 4)

    def fine_step(self, runs: list[Run]) -> int:
        """The step of the grid up to ``coarse_from`` (default: delta)."""
        return self.step or self.gain_delta(runs)

    def c_top(self, runs: list[Run]) -> int:
        """The longest context of the grid (default 4 (L + M): past the attention length of any run)."""
        L, M = grid_segment(runs), max(r.mem_len for r in runs)
        return self.c_max or 4 * (L + M)

    def grid(self, runs: list[Run]) -> list[int]:
        """The attention lengths of the curves and of RECL's gains."""
        L, delta = grid_segment(runs), self.gain_delta(runs)
        step = self.fine_step(runs)
        if step <= 0 or delta % step:
            raise ValueError(
                f"ablate.analysis.context.step must divide delta = {delta} (so that c + delta is on the grid), got "
                f"{step}; e.g. {delta // 2 or 1}"
            )
        c_min, c_max = self.c_min or delta, self.c_top(runs)
        if c_max < c_min + delta:
            raise ValueError(f"the context grid needs c_max >= c_min + delta, got {c_min}, {delta}, {c_max}")
        fine_top = min(c_max, self.coarse_from or 2 * L)
        if fine_top < c_min + delta:
            raise ValueError(
                f"ablate.analysis.context.coarse_from must be >= c_min + delta = {c_min + delta}, got {fine_top}"
            )
        grid = set(range(c_min, fine_top + 1, step))
        c = fine_top
        while c < c_max:  # doubling past the fine part: the cost of a window grows with c
            c = min(2 * c, c_max)
            grid |= {c - delta, c}
        M = max(r.mem_len for r in runs)
        for c in (L, L + M, 2 * (L + M)):  # the lengths the effective-context section and its verdict read
            if c_min <= c <= c_max:
                grid |= {c} | ({c - delta} if c - delta >= c_min else set())
        return sorted(grid)

    def evaluation(self, runs: list[Run], split: str) -> AtContexts:
        """The grid and every run's training attention length within it, for ``at_contexts``."""
        grid = self.grid(runs)
        trained = {r.train_attention_length for r in runs if 0 < r.train_attention_length <= grid[-1]}
        window_max = self.window_max or grid[-1]
        return AtContexts(tuple(sorted(set(grid) | trained)), split, self.n_rows, self.n_score, window_max)


@dataclass
class TokenLosses:
    """One run's dump. loss, correct: [n_c, rows, n] (n_c = 1 as trained); documents, units, scored, distance:
    [rows, n]; contexts: [n_c] (as trained: the run's own attention length); not_served: c -> the reason.
    ``units``: each target's family (``Corpus.families``), the clusters of the intervals. As trained only:
    ``predicted`` [1, rows, n] the argmax token, ``target`` [rows, n] the true one (the reach's permutation null
    re-pairs them)."""

    loss: np.ndarray
    correct: np.ndarray
    documents: np.ndarray
    units: np.ndarray
    scored: np.ndarray
    distance: np.ndarray
    contexts: list[int]
    meta: dict
    not_served: dict[int, str] = field(default_factory=dict)
    predicted: np.ndarray | None = None
    target: np.ndarray | None = None

    def at(self, c: int | None = None) -> np.ndarray:
        """[tokens] losses of the scored tokens (row by row) at context c (None: the only one)."""
        k = 0 if c is None else self.contexts.index(c)
        return self.loss[k][self.scored]

    def correct_at(self, c: int | None = None) -> np.ndarray:
        k = 0 if c is None else self.contexts.index(c)
        return self.correct[k][self.scored]

    @property
    def token_documents(self) -> np.ndarray:
        """[tokens] the document of each scored token (row by row)."""
        return self.documents[self.scored]

    @property
    def token_units(self) -> np.ndarray:
        """[tokens] the unit (family) of each scored token (row by row): the clusters of every interval."""
        return self.units[self.scored]


def _fingerprint(run: Run) -> dict:
    st = run.checkpoint.stat()
    return {
        "run": run.name,
        "cell": run.cell,
        "seed": run.seed,
        "corpus": run.corpus_key,
        "checkpoint": str(run.checkpoint),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def _reuse(path: Path, meta: dict, log) -> TokenLosses | None:
    if not path.is_file():
        return None
    try:
        d = read_dump(path)
    except (RunError, CorruptFileError) as e:
        log(f"  {path} cannot be read ({e}); computing it again")
        return None
    return d if d.meta == meta else None


def _write(path: Path, d: TokenLosses) -> TokenLosses:
    save_npz(
        path,
        loss=d.loss.astype(np.float32),
        correct=d.correct,
        documents=d.documents,
        units=d.units,
        scored=d.scored,
        distance=d.distance,
        contexts=np.array(d.contexts),
        meta=json.dumps(d.meta),
        not_served=json.dumps({str(k): v for k, v in d.not_served.items()}),
        **{k: v for k, v in (("predicted", d.predicted), ("target", d.target)) if v is not None},
    )
    return d


def read_dump(path: Path) -> TokenLosses:
    """A dump written by this module; RunError naming the file if it is not one."""
    z = load_npz(path, remedy="delete it; the next analysis of its run computes it again")
    missing = {"loss", "correct", "documents", "scored", "distance", "contexts", "meta"} - set(z)
    if missing:
        raise RunError(f"{path} is not a per-token loss dump (it lacks {sorted(missing)}); delete it")
    not_served = {int(k): v for k, v in json.loads(str(z.get("not_served", "{}"))).items()}
    return TokenLosses(
        z["loss"],
        z["correct"],
        z["documents"],
        z["units"] if "units" in z else z["documents"],  # a dump of before the units: its meta makes it stale
        z["scored"].astype(bool),
        z["distance"],
        z["contexts"].tolist(),
        json.loads(str(z["meta"])),
        not_served,
        z["predicted"] if "predicted" in z else None,
        z["target"] if "target" in z else None,
    )


def _side(side: dict, key: str, positions: np.ndarray, default) -> np.ndarray:
    return np.asarray(side[key])[positions] if key in side else np.full(positions.shape, default)


def as_trained_targets(n_data: int, s: AsTrained, split: str = "test") -> np.ndarray:
    """[n_streams, n] the positions, in a split of ``n_data`` tokens, of the targets the as-trained evaluation
    scores: ``s.n_streams`` streams spread evenly over the split, ``s.n_tokens`` each (fewer if it is short)."""
    stride = (n_data - 1) // s.n_streams
    n = min(s.n_tokens, stride)
    if n < 1:
        raise RunError(f"the {split} split ({n_data:,} tokens) is too short for {s.n_streams} streams")
    return (np.arange(s.n_streams) * stride)[:, None] + 1 + np.arange(n)


def scored_files(corpus, s: AsTrained, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(scored tokens of each document, its family) of the targets the as-trained evaluation of ``corpus`` scores
    (``as_trained_targets``, less those its ``loss_mask`` leaves out): the layout of a report's intervals, before
    any run is trained."""
    targets = as_trained_targets(len(corpus.split(split)), s, split)
    scored = _side(corpus.side.get(split, {}), "loss_mask", targets, True).astype(bool)
    files, family = file_layout(corpus.documents(split)[targets][scored], corpus.families(split)[targets][scored])
    return np.bincount(files, minlength=len(family)), family


def file_layout(documents: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """documents, units: [tokens] -> (the file of each token, numbered 0..K-1; [K] the family of each file)."""
    ids, files = np.unique(documents, return_inverse=True)
    family = np.zeros(len(ids), dtype=np.int64)
    family[files] = units
    return files, family


def as_trained(run: Run, s: AsTrained, split: str, path: Path, log=print) -> TokenLosses:
    """The run evaluated as trained on ``s.n_streams`` x ``s.n_tokens`` targets of ``split`` (module doc)."""
    meta = {**_fingerprint(run), "kind": "as_trained", "split": split, "units": UNITS, "keeps": KEEPS, **asdict(s)}
    if (d := _reuse(path, meta, log)) is not None:
        return d
    data, side = run.split(split)
    targets = as_trained_targets(len(data), s, split)
    rows = np.asarray(data)[np.concatenate([targets[:, :1] - 1, targets], axis=1)].astype(np.int64)
    res = stream_losses(
        run.model(), rows, segment_len=run.segment_len, mem_len=run.mem_len, episode_len=run.episode_len
    )
    d = TokenLosses(
        loss=res.loss.numpy()[None],
        correct=res.correct.numpy()[None],
        documents=run.corpus().documents(split)[targets],
        units=run.corpus().families(split)[targets],
        scored=_side(side, "loss_mask", targets, True).astype(bool),
        distance=_side(side, "distance", targets, -1).astype(np.int64),
        contexts=[run.train_attention_length],
        meta=meta,
        predicted=res.predicted.numpy().astype(np.int32)[None],
        target=rows[:, 1:].astype(np.int32),
    )
    return _write(path, d)


def at_contexts(run: Run, s: AtContexts, path: Path, log=print) -> TokenLosses:
    """Per-token losses of ``run`` at every context length of ``s.contexts`` (module doc)."""
    mode = "memory" if run.recurrence else "window"
    meta = {
        **_fingerprint(run),
        "kind": "at_contexts",
        "mode": mode,
        "units": UNITS,
        "serves": SERVES,
        **asdict(s),
        "contexts": list(s.contexts),
    }
    if (d := _reuse(path, meta, log)) is not None:
        return d
    data, side = run.split(s.split)
    start = max(s.contexts)
    rows = stream_rows(data, s.n_rows, start + s.n_score)
    stride = (len(data) - 1) // s.n_rows
    targets = (np.arange(s.n_rows) * stride)[:, None] + start + 1 + np.arange(s.n_score)
    shape = (s.n_rows, s.n_score)
    model = run.model()
    not_served: dict[int, str] = {}
    # a window starts at offset 0: a scheme that reads offsets (global_sinusoid) saw positions < T in training
    T = run.episode_len if mode == "window" and run.episode_len and reads_offsets(model) else None
    for c in s.contexts:  # before any compute: what the scheme (or window_max) refuses is NaN, with its reason
        try:
            if mode == "window" and s.window_max is not None and c > s.window_max:
                raise ValueError(f"windows longer than {s.window_max} tokens are not evaluated (window_max)")
            if T is not None and c + 1 > T:
                raise ValueError(
                    f"a window of {c + 1} positions passes its training episodes (T = {T}): it reads stream offsets "
                    "and never saw positions >= T (the extrapolation section's horizon axis measures that)"
                )
            if mode == "window":
                model.validate_lengths(c + 1, 0, max_offset=c)
        except ValueError as e:
            not_served[c] = str(e)
    served = [c for c in s.contexts if c not in not_served]
    if mode == "window" and served:  # every window length from one pass per window start
        results = window_losses(
            model, rows, served, score_start=start, n_score=s.n_score, window_batch_tokens=s.window_batch_tokens
        )
    else:
        results = {}
    loss, correct = [], []
    for c in s.contexts:
        try:
            if c in not_served:
                raise ValueError(not_served[c])
            res = (
                results[c]
                if c in results
                else context_losses(
                    model, rows, c, score_start=start, n_score=s.n_score, mode=mode, segment_len=run.segment_len
                )
            )
            loss.append(res.loss.numpy())
            correct.append(res.correct.numpy())
        except ValueError as e:  # the scheme cannot serve this context: NaN, and its reason
            not_served[c] = str(e)
            loss.append(np.full(shape, np.nan, dtype=np.float32))
            correct.append(np.zeros(shape, dtype=bool))
    d = TokenLosses(
        loss=np.stack(loss),
        correct=np.stack(correct),
        documents=run.corpus().documents(s.split)[targets],
        units=run.corpus().families(s.split)[targets],
        scored=_side(side, "loss_mask", targets, True).astype(bool),
        distance=_side(side, "distance", targets, -1).astype(np.int64),
        contexts=list(s.contexts),
        meta=meta,
        not_served=not_served,
    )
    return _write(path, d)


def same_tokens(dumps: dict[str, TokenLosses]) -> np.ndarray:
    """The units (families, ``TokenLosses.units``) of the scored tokens shared by every dump of a group; RunError
    if the dumps score different tokens (they cannot be paired)."""
    first = next(iter(dumps.values()))
    for name, d in dumps.items():
        if d.scored.shape != first.scored.shape or not np.array_equal(d.scored, first.scored):
            raise RunError(f"dump of {name} scores other tokens than the rest of its group: evaluate the group alike")
        if not np.array_equal(d.documents, first.documents):
            raise RunError(f"dump of {name} has other documents than the rest of its group: evaluate the group alike")
    return first.token_units


def seed_losses(
    cells: dict[str, list], dumps: dict[str, TokenLosses], grid
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(cell -> [n_seeds, n_c, tokens] losses of its runs at the contexts ``grid`` (NaN where not served), the
    units of the scored tokens) from the controlled-context dumps (run name -> dump): what RECL and the effective
    context read, the same tokens for every run (``same_tokens``)."""
    units = same_tokens(dumps)
    contexts = next(iter(dumps.values())).contexts
    k = [contexts.index(c) for c in grid]
    per_seed = {
        c: np.stack([dumps[r.name].loss[k][:, dumps[r.name].scored] for r in runs]) for c, runs in cells.items()
    }
    return per_seed, units


def stack(dumps: list[TokenLosses], c: int | None = None, correct: bool = False) -> np.ndarray:
    """[n_seeds, tokens] of a cell's runs at context c (``correct``: 0/1 argmax hits instead of losses)."""
    return np.stack([(d.correct_at(c).astype(np.float64) if correct else d.at(c).astype(np.float64)) for d in dumps])
