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
"""

from __future__ import annotations

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


def _option_problems(o: dict) -> list[str]:
    """Why these options (``data.corpus.*``) cannot make the task, each naming its key and what is valid."""
    minimum = dict(seed=0, n_train=1, min_len=1, n_symbols=2, max_factor=1, train_tokens=1, eval_instances=1)
    minimum["align_to_segment"] = 0
    out = [
        f"data.corpus.{k} must be an integer >= {low}, got {o[k]!r}"
        for k, low in minimum.items()
        if isinstance(o[k], bool) or not isinstance(o[k], int) or o[k] < low
    ]
    if out:
        return out
    if o["min_len"] > o["n_train"]:
        out.append(f"data.corpus.min_len={o['min_len']} is above data.corpus.n_train={o['n_train']}: it must be <=")
    if o["max_factor"] & (o["max_factor"] - 1):
        out.append(f"data.corpus.max_factor must be a power of 2 (the test lengths double), got {o['max_factor']}")
    return out


def eval_lengths(n_train: int, max_factor: int) -> list[int]:
    """The test lengths: n_train, 2 n_train, 4 n_train, ... max_factor n_train."""
    return [n_train * (1 << k) for k in range(max_factor.bit_length())]


def _keys(inputs: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in np.ascontiguousarray(inputs, dtype=np.int64)]


def _train(task: Task, rng, o: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, set]]:
    """The training stream (tokens, loss_mask, distance) and, per length, the inputs it holds."""
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
    return (*_layout(task, parts, lengths, o), seen)


def _layout(task: Task, parts: list[np.ndarray], lengths, o: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, loss_mask, distance) of the instances ``parts`` in order, packed or aligned (module doc)."""
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
    return tokens, mask, distance


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
    return _layout(task, parts, lengths, o)


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
        tokens, mask, distance = _layout(task, parts, kept, o)
        if not align:  # the end token of the instance the chunk before cut: the first one starts as every one does
            end = len(task.vocab(S)) - 1
            tokens = np.concatenate([np.array([end], dtype=tokens.dtype), tokens])
            mask, distance = np.concatenate([[False], mask]), np.concatenate([[-1], distance]).astype(distance.dtype)
        if len(tokens) < K:  # aligned: pads to the chunk's end, never scored
            extra = K - len(tokens)
            tokens = np.concatenate([tokens, np.full(extra, len(task.vocab(S)), dtype=tokens.dtype)])
            mask, distance = np.pad(mask, (0, extra)), np.pad(distance, (0, extra), constant_values=-1)
        return {"tokens": tokens[:K], "loss_mask": mask[:K], "distance": distance[:K]}

    def identity(self) -> dict:
        return {"version": 1, "task": self.task, **self.options, "chunk_tokens": self.chunk_tokens}


def _fresh(task: Task, options: dict) -> Corpus:
    """The corpus of ``task`` with fresh training instances (``options["fresh"]``): val and test drawn as always
    (apart from each other), held out of the training draws; nothing cached (the draws take milliseconds)."""
    base, seen, arrays = [options["seed"], zlib.crc32(task.name.encode())], {}, {}
    for i, split in enumerate(SPLITS[1:], 1):
        tokens, mask, distance = _evaluation(task, np.random.default_rng([*base, i]), options, seen, split)
        arrays[split] = (tokens, {"loss_mask": mask, "distance": distance})
    draw = FreshDraw(task, options, seen)
    train = DrawnSplit(draw, draw.chunk_tokens, options["train_tokens"], draw.identity())
    side = {"train": {k: train.side(k) for k in ("loss_mask", "distance")}} | {s: a[1] for s, a in arrays.items()}
    align = options["align_to_segment"]
    return Corpus(
        task.name,
        train,
        arrays["val"][0],
        arrays["test"][0],
        vocab_size=len(task.vocab(options["n_symbols"])) + (1 if align else 0),
        itos=task.vocab(options["n_symbols"]) + ([PAD] if align else []),
        side=side,
        document_separator=len(task.vocab(options["n_symbols"])) - 1,
        align=align,
    )


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
    if options.pop("fresh", False):
        return _fresh(task, {**options, "fresh": True})
    align = options["align_to_segment"]

    def build():
        base = [options["seed"], zlib.crc32(task.name.encode())]
        tokens, mask, distance, seen = _train(task, np.random.default_rng([*base, 0]), options)
        arrays = {"train": tokens, "train.loss_mask": mask, "train.distance": distance}
        for i, split in enumerate(SPLITS[1:], 1):
            tokens, mask, distance = _evaluation(task, np.random.default_rng([*base, i]), options, seen, split)
            arrays.update({split: tokens, f"{split}.loss_mask": mask, f"{split}.distance": distance})
        return arrays, task.vocab(options["n_symbols"]) + ([PAD] if align else []), {}

    key = {"version": 1, "task": task.name, **options}
    if not align:  # the packed corpus keeps its cache key (and its cached files) from before the option
        key.pop("align_to_segment")
    arrays, itos, _ = cached(key_dir(root / "lengthgen" / task.name, key), key, build)
    side = {s: {"loss_mask": arrays[f"{s}.loss_mask"], "distance": arrays[f"{s}.distance"]} for s in SPLITS}
    return Corpus(
        task.name,
        *(arrays[s] for s in SPLITS),
        vocab_size=len(itos),
        itos=itos,
        side=side,
        document_separator=len(task.vocab(options["n_symbols"])) - 1,
        align=align,
    )


def register_task(
    name: str,
    space: Callable[[int, int], int],
    *,
    extra: tuple[str, ...] = (),
    symbol_names: Callable[[int], list[str]] | None = None,
    n_symbols: int = 8,
    source: str = "",
):
    """Decorator: the instance generator ``make`` becomes task ``name`` (``Task``) and corpus ``name``, whose
    options are those of ``load`` below (``n_symbols``: this task's default alphabet)."""

    def add(make):
        task = Task(name, make, space, extra, symbol_names or Task.symbol_names, source)
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
        ) -> Corpus:
            """Task ``name``: the data's own seed; training lengths min_len..n_train; ``n_symbols`` the alphabet;
            test lengths n_train .. max_factor n_train (doubling); ``train_tokens`` of training instances;
            ``eval_instances`` per test length in val and test; ``align_to_segment``: 0 packed, else every instance
            starts a segment of this length (data.segment_len; module doc); ``fresh``: training instances drawn on
            the fly, no stretch of the stream read twice (``train_tokens``: the positions of one pass; module doc)."""
            options = dict(seed=seed, n_train=n_train, min_len=min_len, n_symbols=n_symbols, max_factor=max_factor)
            options.update(train_tokens=train_tokens, eval_instances=eval_instances, align_to_segment=align_to_segment)
            if fresh:  # the cache key of a corpus of before the option is kept: the option only where it is set
                options["fresh"] = True
            return load_task(task, root, options)

        load.__name__ = f"load_{name}"
        register_corpus(name, unit="word", answers=True)(load)
        TASKS[name] = task
        return make

    return add


def task_instances(corpus: Corpus, split: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per test length n of a task's val or test split: (rows [k, w], scored [k, w - 1]): each instance as training
    read it, and which of its targets (rows[:, 1:]) are answer tokens. Packed: the end token before the instance
    (after the previous one), w = 1 + size; aligned (``corpus.align``): the instance alone from a segment's first
    position, w = size."""
    tokens, side = np.asarray(corpus.split(split)), corpus.side[split]
    distance, mask = np.asarray(side["distance"]), np.asarray(side["loss_mask"])
    keep = tokens < (corpus.vocab_size - 1 if corpus.align else corpus.vocab_size)  # the pads out
    tokens, distance, mask = tokens[keep], distance[keep], mask[keep]
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
        if corpus.align:
            out[int(n)] = (tokens[at].astype(np.int64), mask[at][:, 1:])
            continue
        rows = np.concatenate([np.full((len(which), 1), corpus.document_separator), tokens[at]], axis=1)
        out[int(n)] = (rows.astype(np.int64), mask[at])
    return out
