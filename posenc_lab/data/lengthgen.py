"""Length-generalization tasks: algorithmic corpora with answer-only scoring, trained short and tested long.

A task is one module of this package that registers an instance generator with ``@register_task``; that makes
it a corpus (``data=<task>``, its loader's options ``data.corpus.*``) and lists it in ``TASKS``, where the
report's lengthgen section finds it. An instance of length n is

    input (n symbols, or as the task frames it)  =  answer  .

``=`` asks for the answer, ``.`` ends the instance (the corpus's ``document_separator``: one instance is one
document, the unit of the report's intervals). Only the answer's tokens are scored (``loss_mask``), in training
too; ``distance`` holds n at each of them (-1 elsewhere), so the trainer's ``acc_d*`` metrics bucket by length.

Splits, each from the data's own seed (``data.corpus.seed``, with the task's name and the split), so every run
sees the same data: ``train`` is instances of lengths drawn uniformly from min_len..n_train, concatenated to
``train_tokens`` tokens, read again on every pass of a long run; or, with ``fresh: true``, drawn on the fly
(``FreshDraw``, a ``DrawnSplit``): every chunk of ``FRESH_CHUNK`` tokens from a generator seeded by the chunk's
index, so no stretch of the stream is read twice (each pass over the streams reads new chunks, every instance drawn
afresh, with replacement, as Ruoss et al. draw theirs; ``train_tokens`` is then the positions of one pass, which an
absolute encoding sees), a resumed run reads what it would have, and no training input is one of val's or test's
(those are held out of the draws). ``val`` and ``test`` hold
``eval_instances`` instances at each length n_train, 2 n_train, 4 n_train, ... max_factor n_train, in that order,
none of whose inputs occurs in training or in the other evaluation split. The streams read them in order
(``streams.py``): an instance longer than a segment is read through the memory.

Layout: packed end to end (``align_to_segment: 0``, the default), or aligned (``align_to_segment: L``, set to
``data.segment_len``): every instance starts at a multiple of L tokens, the rest of its last block of L filled
with the pad token ``_`` (never scored, never an answer), and the streams are cut at multiples of L too
(``Corpus.align``), so every instance begins a segment. Packed, a segment without memory cuts the instances that
straddle its start (their answers lose their input) and an absolute encoding sees an instance at any offset;
aligned, as Ruoss et al. 2023 train, each instance starts at position 0. The same instances either way (the same
seed draws them); an instance longer than L continues into the next segment (read through the memory).

Position ids (``position_ids: true``; read by ``model.data_positions``, posenc_lab/data_positions.py): the corpus
also gives, per split, every token's ids of each kind the task has (``Task.position_ids``): ``abacus`` for every task
(1 + a symbol's index within its run of symbols, McLeish et al. 2024), ``coupling`` where the task defines
``couple`` (addition's digits of one significance share an id, Cho et al. 2024); 0 on every other token and on pads.
Each training instance's nonzero ids are shifted by one draw from 0..``position_shift``, from a generator of their
own (the tokens are those of the same options without ids); validation and test instances are unshifted.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache import cached, key_dir
from .drawn import DrawnSplit
from .registry import Corpus, register_corpus
from .splits import SPLITS

QUERY, END, PAD = "=", ".", "_"
#: how often drawing fresh evaluation instances may come up short before the options are called too small
_DRAWS = 64
#: the tokens of a chunk of fresh training instances (``fresh: true``): at least this many, whole segments aligned
FRESH_CHUNK = 4096
_FRESH_STREAM = 3  # the generator of the fresh chunks: after those of the training array (0), val (1) and test (2)
_SHIFT_STREAM = 7  # the generator of the training instances' position-id shifts, beside that of their tokens


@dataclass(frozen=True)
class Task:
    """A registered task. ``make(rng, n, count, n_symbols) -> (inputs [count, a], answers [count, b])``: symbol
    ids in [0, n_symbols), a and b fixed given n; ``extra``: the task's own tokens after the symbols (e.g. ``+``),
    which ``make`` writes as n_symbols, n_symbols + 1, ...; ``space(n, n_symbols)``: how many distinct inputs of
    length n exist; ``symbol_names(n_symbols)``: the symbols' names (vocabulary)."""

    name: str
    make: Callable[[np.random.Generator, int, int, int], tuple[np.ndarray, np.ndarray]]
    space: Callable[[int, int], int]
    extra: tuple[str, ...] = ()
    symbol_names: Callable[[int], list[str]] = lambda s: [f"s{i}" for i in range(s)]
    source: str = ""  # where the task is framed so (the report names it)
    couple: Callable[[int], np.ndarray] | None = None  # the coupled position ids of an instance of length n

    def position_ids(self, n: int, n_symbols: int) -> dict[str, np.ndarray]:
        """The position ids of every token of an instance of length n, laid out ``input = answer .`` (the same for
        every instance of one length: its symbols sit at fixed places), by kind: abacus, and coupling where the task
        has ``couple``; 0: none."""
        return _id_templates(self, n, n_symbols)

    def vocab(self, n_symbols: int) -> list[str]:
        return [*self.symbol_names(n_symbols), *self.extra, QUERY, END]

    def instances(self, rng: np.random.Generator, n: int, count: int, n_symbols: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, tokens [count, size]): ``count`` instances of length n, laid out ``input = answer .``"""
        inputs, answers = self.make(rng, n, count, n_symbols)
        vocab = len(self.vocab(n_symbols))
        query = np.full((count, 1), vocab - 2, dtype=np.int64)
        end = np.full((count, 1), vocab - 1, dtype=np.int64)
        return inputs, np.concatenate([inputs, query, answers, end], axis=1).astype(np.int32)


TASKS: dict[str, Task] = {}


@functools.lru_cache(maxsize=4096)
def _id_templates(task: Task, n: int, n_symbols: int) -> dict[str, np.ndarray]:
    """``Task.position_ids``: abacus from a template instance's tokens, coupling from the task's ``couple``."""
    row = task.instances(np.random.default_rng(0), n, 1, n_symbols)[1][0]
    digit = row < n_symbols  # the task's symbols (digits): its own tokens, "=", "." are not
    # Abacus (McLeish et al. 2024): 1 + the index of a symbol within its run of consecutive symbols, counted from the
    # run's first (a number's start), 0 elsewhere: [a c b = b c a .] -> [1 2 3 0 1 2 3 0]
    run_start = np.maximum.accumulate(np.where(digit & ~np.r_[False, digit[:-1]], np.arange(len(row)), 0))
    out = {"abacus": np.where(digit, np.arange(len(row)) - run_start + 1, 0)}
    if task.couple is not None:
        coupled = np.asarray(task.couple(n), dtype=np.int64)
        if coupled.shape != row.shape or coupled.min() < 0:
            raise ValueError(f"task {task.name}: couple({n}) gave {coupled.shape} ids, not {row.shape} ids >= 0")
        out["coupling"] = coupled
    return out


def _option_problems(o: dict) -> list[str]:
    """Why these options (``data.corpus.*``) cannot make the task, each naming its key and what is valid."""
    minimum = dict(seed=0, n_train=1, min_len=1, n_symbols=2, max_factor=1, train_tokens=1, eval_instances=1)
    minimum.update(align_to_segment=0, position_shift=0)
    out = [
        f"data.corpus.{k} must be an integer >= {low}, got {o[k]!r}"
        for k, low in minimum.items()
        if isinstance(o[k], bool) or not isinstance(o[k], int) or o[k] < low
    ]
    if out:
        return out
    if o["min_len"] > o["n_train"]:
        out.append(f"data.corpus.min_len={o['min_len']} is above data.corpus.n_train={o['n_train']}: it must be <=")
    if o["position_shift"] and not o["position_ids"]:
        out.append(
            f"data.corpus.position_shift={o['position_shift']} shifts position ids the corpus does not give: set "
            f"data.corpus.position_ids=true, or position_shift=0"
        )
    if o["max_factor"] & (o["max_factor"] - 1):
        out.append(f"data.corpus.max_factor must be a power of 2 (the test lengths double), got {o['max_factor']}")
    return out


def eval_lengths(n_train: int, max_factor: int) -> list[int]:
    """The test lengths: n_train, 2 n_train, 4 n_train, ... max_factor n_train."""
    return [n_train * (1 << k) for k in range(max_factor.bit_length())]


def _keys(inputs: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in np.ascontiguousarray(inputs, dtype=np.int64)]


def _train(task: Task, seed: list[int], o: dict) -> tuple[dict[str, np.ndarray], dict[int, set]]:
    """The training stream's arrays (``_layout``) from the generator seeded by ``seed`` and, per length, the inputs
    it holds."""
    rng = np.random.default_rng(seed)
    lo, hi, S = o["min_len"], o["n_train"], o["n_symbols"]
    sizes = {n: task.instances(rng, n, 1, S)[1].shape[1] for n in range(lo, hi + 1)}
    mean = np.mean(list(sizes.values()))
    lengths = rng.integers(lo, hi + 1, int(o["train_tokens"] / mean * 1.2) + 8)
    ends = np.cumsum([sizes[n] for n in lengths])
    lengths = lengths[: int(np.searchsorted(ends, o["train_tokens"])) + 1]  # whole instances, >= train_tokens
    rows, seen = {}, {}
    for n in np.unique(lengths):
        inputs, rows[n] = task.instances(rng, int(n), int((lengths == n).sum()), S)
        seen[int(n)] = set(_keys(inputs))
    taken = dict.fromkeys(rows, 0)
    parts = []
    for n in lengths:  # in the drawn order: lengths mixed along the stream
        parts.append(rows[n][taken[n]])
        taken[n] += 1
    return _layout(task, parts, lengths, o, _shifts(o, len(parts), seed)), seen


def _shifts(o: dict, count: int, seed: list[int]) -> np.ndarray | None:
    """The training instances' shifts of their position ids, uniform in 0..position_shift (McLeish et al.'s k,
    Cho et al.'s random start), one per instance, so that an instance read across segments keeps one; from a
    generator of their own, so that the tokens are the same with or without position ids. None without them."""
    if not o.get("position_ids"):
        return None
    return np.random.default_rng([*seed, _SHIFT_STREAM]).integers(0, o["position_shift"] + 1, count)


def _layout(task: Task, parts: list[np.ndarray], lengths, o: dict, shifts=None) -> dict[str, np.ndarray]:
    """{"tokens", "loss_mask", "distance"} of the instances ``parts`` in order, packed or aligned (module doc), and
    with ``position_ids`` in the options {"position_ids.<kind>"}: each instance's ids (``Task.position_ids``), the
    nonzero ones plus its shift (``shifts``: one per instance; None: 0), 0 on pads."""
    S, align = o["n_symbols"], o["align_to_segment"]
    query = len(task.vocab(S)) - 2
    sizes = np.array([len(p) for p in parts])
    # aligned: each instance takes whole blocks of L (ceil(size / L) L tokens); one more pad: the last target
    spans = -(-sizes // align) * align if align else sizes
    starts = np.cumsum(spans) - spans
    total = int(spans.sum()) + (1 if align else 0)
    tokens = np.full(total, len(task.vocab(S)), dtype=np.int32)  # the pad token (aligned only)
    mask = np.zeros(total, dtype=bool)
    distance = np.full(total, -1, dtype=np.int32)
    for part, n, start in zip(parts, lengths, starts):  # the answer: after the (first) query, before the end
        tokens[start : start + len(part)] = part
        first = start + int(np.flatnonzero(part == query)[0]) + 1
        mask[first : start + len(part) - 1] = True
        distance[first : start + len(part) - 1] = n
    out = {"tokens": tokens, "loss_mask": mask, "distance": distance}
    if o.get("position_ids"):
        shifts = np.zeros(len(parts), dtype=np.int64) if shifts is None else shifts
        for kind in task.position_ids(1, S):
            ids = np.zeros(total, dtype=np.int32)
            for part, n, start, k in zip(parts, lengths, starts, shifts):
                template = task.position_ids(int(n), S)[kind]
                ids[start : start + len(part)] = np.where(template > 0, template + k, 0)
            out[f"position_ids.{kind}"] = ids
    return out


def _evaluation(task: Task, rng, o: dict, seen: dict[int, set], split: str):
    """``eval_instances`` fresh instances per test length (none in ``seen``, which then holds them too)."""
    S, count, parts, lengths = o["n_symbols"], o["eval_instances"], [], []
    for n in eval_lengths(o["n_train"], o["max_factor"]):
        known, got = seen.setdefault(n, set()), []
        for _ in range(_DRAWS):
            inputs, rows = task.instances(rng, n, 2 * count, S)
            for key, row in zip(_keys(inputs), rows):
                if key not in known and len(got) < count:
                    known.add(key)
                    got.append(row)
            if len(got) == count:
                break
        else:
            raise ValueError(
                f"{task.name} corpus: only {len(got)} distinct {split} inputs of length {n} that training does not "
                f"hold (data.corpus.n_symbols={S}, n_train={o['n_train']}); lower data.corpus.eval_instances="
                f"{count} or raise n_symbols or n_train"
            )
        parts += got
        lengths += [n] * count
    return _layout(task, parts, lengths, o)  # unshifted: the ids a model is judged on are those the task gives


class FreshDraw:
    """Chunk c of a task's fresh training split (``DrawnSplit``'s ``draw``): instances of lengths uniform in
    min_len..n_train from a generator seeded by (the data's seed, the task, c), skipping any whose input is held out
    (val's and test's inputs, by length), laid out as the options say (``_layout``) into exactly ``chunk_tokens``:
    packed, the chunk starts with an end token (every instance follows one, as in the packed layout) and its last
    instance is cut at its end (the answer tokens before the cut are still right targets); aligned, the chunk ends in
    pad tokens where the next instance would not fit."""

    def __init__(self, task: Task, options: dict, held_out: dict[int, set[bytes]]):
        self.task, self.options, self.held_out = task.name, dict(options), held_out
        o, align = self.options, self.options["align_to_segment"]
        self.sizes = {n: self._size(task, n) for n in range(o["min_len"], o["n_train"] + 1)}
        tokens = max(FRESH_CHUNK, 2 * max(self.sizes.values()))
        self.chunk_tokens = -(-tokens // align) * align if align else tokens

    def _size(self, task: Task, n: int) -> int:
        return task.instances(np.random.default_rng(0), n, 1, self.options["n_symbols"])[1].shape[1]

    def __call__(self, c: int) -> dict[str, np.ndarray]:
        task, o, K = TASKS[self.task], self.options, self.chunk_tokens
        align, S = o["align_to_segment"], o["n_symbols"]
        rng = np.random.default_rng([o["seed"], zlib.crc32(task.name.encode()), _FRESH_STREAM, c])
        lengths = rng.integers(o["min_len"], o["n_train"] + 1, 2 * (K // min(self.sizes.values())) + 8)
        drawn = {}
        for n in np.unique(lengths):
            inputs, rows = task.instances(rng, int(n), int((lengths == n).sum()), S)
            held = self.held_out.get(int(n), ())
            drawn[n] = iter(rows if not held else rows[[key not in held for key in _keys(inputs)]])
        parts, kept, total = [], [], 0 if align else 1  # packed: an end token first (see below)
        for n in lengths:  # in the drawn order; a held-out draw is skipped
            row = next(drawn[n], None)
            if row is None:
                continue
            span = -(-len(row) // align) * align if align else len(row)
            if align and total + span > K:
                break
            parts.append(row)
            kept.append(n)
            total += span
            if total >= K:
                break
        if not align and total < K:  # only if nearly every input is held out: the options say so first
            raise ValueError(f"{task.name} corpus: a fresh chunk drew {total} of its {K} tokens")
        out = _layout(
            task, parts, kept, o, _shifts(o, len(parts), [o["seed"], zlib.crc32(task.name.encode()), _FRESH_STREAM, c])
        )
        pad = {"tokens": len(task.vocab(S)), "loss_mask": False, "distance": -1}  # position ids: 0
        if not align:  # the end token of the instance the chunk before cut: the first one starts as every one does
            out = {k: np.concatenate([[len(task.vocab(S)) - 1 if k == "tokens" else pad.get(k, 0)], a]).astype(a.dtype)
                   for k, a in out.items()}  # fmt: skip
        # aligned: pads to the chunk's end, never scored
        return {k: np.pad(a, (0, max(K - len(a), 0)), constant_values=pad.get(k, 0))[:K] for k, a in out.items()}

    def identity(self) -> dict:
        return {"version": 1, "task": self.task, **self.options, "chunk_tokens": self.chunk_tokens}


def _fresh(task: Task, options: dict) -> Corpus:
    """The corpus of ``task`` with fresh training instances (``options["fresh"]``): val and test drawn as always
    (apart from each other), held out of the training draws; nothing cached (the draws take milliseconds)."""
    base, seen, arrays = [options["seed"], zlib.crc32(task.name.encode())], {}, {}
    for i, split in enumerate(SPLITS[1:], 1):
        arrays[split] = _evaluation(task, np.random.default_rng([*base, i]), options, seen, split)
    draw = FreshDraw(task, options, seen)
    train = DrawnSplit(draw, draw.chunk_tokens, options["train_tokens"], draw.identity())
    arrays["train"] = {"tokens": train} | {k: train.side(k) for k in draw(0) if k != "tokens"}
    return _corpus(task, options, arrays)


def _itos(task: Task, options: dict) -> list[str]:
    return task.vocab(options["n_symbols"]) + ([PAD] if options["align_to_segment"] else [])


def _corpus(task: Task, options: dict, arrays: dict[str, dict]) -> Corpus:
    """The Corpus of the split arrays ``arrays`` ({split: {"tokens", side arrays ...}}, ``_layout``'s names)."""
    align = options["align_to_segment"]
    side = {}
    for split, named in arrays.items():
        side[split] = {k: named[k] for k in ("loss_mask", "distance")}
        if ids := {k.split(".", 1)[1]: a for k, a in named.items() if k.startswith("position_ids.")}:
            side[split]["position_ids"] = ids
    return Corpus(
        task.name,
        *(arrays[s]["tokens"] for s in SPLITS),
        vocab_size=len(_itos(task, options)),
        itos=_itos(task, options),
        side=side,
        document_separator=len(task.vocab(options["n_symbols"])) - 1,
        align=align,
        position_id_max=_id_max(task, options) if options.get("position_ids") else {},
    )


def _id_max(task: Task, o: dict) -> dict[str, int]:
    """The largest id of each kind in any split: a training instance's shifted by up to ``position_shift``."""
    S, out = o["n_symbols"], {}
    for n in range(o["min_len"], o["n_train"] + 1):
        for kind, ids in task.position_ids(n, S).items():
            out[kind] = max(out.get(kind, 0), int(ids.max()) + o["position_shift"])
    for n in eval_lengths(o["n_train"], o["max_factor"]):
        for kind, ids in task.position_ids(n, S).items():
            out[kind] = max(out[kind], int(ids.max()))
    return out


def load_task(task: Task, root: Path, options: dict) -> Corpus:
    """The corpus of ``task`` with these options (module docstring), prepared once and cached."""
    if problems := _option_problems(options):
        raise ValueError(f"{task.name} corpus: {'; '.join(problems)}")
    need = 4 * options["eval_instances"]  # two evaluation splits, and room to draw them apart from training
    if (space := task.space(options["n_train"], options["n_symbols"])) < need:
        raise ValueError(
            f"{task.name} corpus: data.corpus.n_symbols={options['n_symbols']} gives {space} distinct inputs of length "
            f"n_train={options['n_train']}, fewer than 4 x data.corpus.eval_instances = {need}; raise n_symbols or "
            f"n_train, or lower eval_instances"
        )

    options = dict(options)
    if not options["position_ids"]:  # the corpus of before the options keeps its cache key and identity
        options.pop("position_ids"), options.pop("position_shift")
    if options.pop("fresh", False):
        return _fresh(task, {**options, "fresh": True})

    def build():
        base = [options["seed"], zlib.crc32(task.name.encode())]
        train, seen = _train(task, [*base, 0], options)
        arrays = {f"train.{k}" if k != "tokens" else "train": a for k, a in train.items()}
        for i, split in enumerate(SPLITS[1:], 1):
            named = _evaluation(task, np.random.default_rng([*base, i]), options, seen, split)
            arrays.update({f"{split}.{k}" if k != "tokens" else split: a for k, a in named.items()})
        return arrays, _itos(task, options), {}

    key = {"version": 1, "task": task.name, **options}
    if not options["align_to_segment"]:  # the packed corpus keeps its cache key (and its cached files) from before
        key.pop("align_to_segment")
    arrays, _, _ = cached(key_dir(root / "lengthgen" / task.name, key), key, build)
    named = {s: {"tokens": arrays[s]} | {k[len(s) + 1 :]: a for k, a in arrays.items() if k.startswith(f"{s}.")}
             for s in SPLITS}  # fmt: skip
    return _corpus(task, options, named)


def register_task(
    name: str,
    space: Callable[[int, int], int],
    *,
    extra: tuple[str, ...] = (),
    symbol_names: Callable[[int], list[str]] | None = None,
    n_symbols: int = 8,
    source: str = "",
    couple: Callable[[int], np.ndarray] | None = None,
):
    """Decorator: the instance generator ``make`` becomes task ``name`` (``Task``) and corpus ``name``, whose
    options are those of ``load`` below (``n_symbols``: this task's default alphabet); ``couple(n)``: the coupled
    position ids of an instance of length n (Cho et al. 2024), where the task has them."""

    def add(make):
        task = Task(name, make, space, extra, symbol_names or Task.symbol_names, source, couple)
        default_symbols = n_symbols

        def load(
            root: Path,
            *,
            seed: int = 0,
            n_train: int = 8,
            min_len: int = 1,
            n_symbols: int = default_symbols,
            max_factor: int = 8,
            train_tokens: int = 300_000,
            eval_instances: int = 128,
            align_to_segment: int = 0,
            fresh: bool = False,
            position_ids: bool = False,
            position_shift: int = 0,
        ) -> Corpus:
            """Task ``name``: the data's own seed; training lengths min_len..n_train; ``n_symbols`` the alphabet;
            test lengths n_train .. max_factor n_train (doubling); ``train_tokens`` of training instances;
            ``eval_instances`` per test length in val and test; ``align_to_segment``: 0 packed, else every instance
            starts a segment of this length (data.segment_len; module doc); ``fresh``: training instances drawn on
            the fly, no stretch of the stream read twice (``train_tokens``: the positions of one pass; module doc);
            ``position_ids``: the corpus also gives every token's position ids of each kind the task has (abacus,
            coupling: ``model.data_positions``), every training instance's shifted by a draw from 0..``position_shift``
            (module doc)."""
            options = dict(seed=seed, n_train=n_train, min_len=min_len, n_symbols=n_symbols, max_factor=max_factor)
            options.update(train_tokens=train_tokens, eval_instances=eval_instances, align_to_segment=align_to_segment)
            options.update(position_ids=position_ids, position_shift=position_shift)
            if fresh:  # the cache key of a corpus of before the option is kept: the option only where it is set
                options["fresh"] = True
            return load_task(task, root, options)

        load.__name__ = f"load_{name}"
        register_corpus(name, unit="word", answers=True)(load)
        TASKS[name] = task
        return make

    return add


def task_instances(corpus: Corpus, split: str) -> dict[int, tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Per test length n of a task's val or test split: (rows [k, w], scored [k, w - 1], ids {kind: [k, w]}): each
    instance as training read it, which of its targets (rows[:, 1:]) are answer tokens, and the position ids of its
    tokens where the corpus gives them ({} otherwise). Packed: the end token before the instance (after the previous
    one; id 0), w = 1 + size; aligned (``corpus.align``): the instance alone from a segment's first position,
    w = size."""
    tokens, side = np.asarray(corpus.split(split)), corpus.side[split]
    distance, mask = np.asarray(side["distance"]), np.asarray(side["loss_mask"])
    keep = tokens < (corpus.vocab_size - 1 if corpus.align else corpus.vocab_size)  # the pads out
    tokens, distance, mask = tokens[keep], distance[keep], mask[keep]
    given = {k: np.asarray(a)[keep] for k, a in side.get("position_ids", {}).items()}
    sizes = np.bincount(np.concatenate([[0], np.cumsum(tokens[:-1] == corpus.document_separator)]))
    starts = np.cumsum(sizes) - sizes
    lengths = np.maximum.reduceat(distance, starts)
    out = {}
    for n in np.unique(lengths[lengths > 0]):
        which = np.flatnonzero(lengths == n)
        size = int(sizes[which[0]])
        if (sizes[which] != size).any():
            raise ValueError(f"corpus {corpus.name}: the {split} instances of length {n} differ in size")
        at = starts[which][:, None] + np.arange(size)
        ids = {k: a[at].astype(np.int64) for k, a in given.items()}
        if corpus.align:
            out[int(n)] = (tokens[at].astype(np.int64), mask[at][:, 1:], ids)
            continue
        rows = np.concatenate([np.full((len(which), 1), corpus.document_separator), tokens[at]], axis=1)
        ids = {k: np.pad(a, ((0, 0), (1, 0))) for k, a in ids.items()}
        out[int(n)] = (rows.astype(np.int64), mask[at], ids)
    return out
