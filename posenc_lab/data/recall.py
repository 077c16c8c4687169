"""The `recall` probe: one planted value, queried D tokens later.

A stream is a sequence of items, one value in flight at a time:

    [gap filler] v [D - 1 filler] ? v
                 ^ planted        ^ query marker, then the answer: the planted value again

D is uniform in [min_distance, max_distance]; the gap (0..max_gap filler tokens) varies where
items start relative to segment boundaries. The answer is always the most recent value token
before the marker, D positions before the marker. Only answers are scored (loss_mask) and the
distance array holds D at each answer, -1 elsewhere, so accuracy can be bucketed by distance.

Vocabulary: ids [0, n_filler) filler, [n_filler, n_filler + n_values) values, then the marker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .cache import cached, key_dir
from .registry import Corpus, register_corpus
from .splits import SPLITS


def recall_vocab(n_values: int = 16, n_filler: int = 32) -> list[str]:
    """id -> symbol: f0.. filler, v0.. values, '?' the query marker."""
    return [f"f{i}" for i in range(n_filler)] + [f"v{i}" for i in range(n_values)] + ["?"]


def make_recall(
    n_tokens: int,
    *,
    seed=0,
    n_values: int = 16,
    n_filler: int = 32,
    min_distance: int = 2,
    max_distance: int = 80,
    max_gap: int = 8,
):
    """Generate one recall stream, deterministic given `seed` (an int or a sequence of ints).

    Returns tokens [n_tokens] (int32), loss_mask [n_tokens] (bool, True at answers) and
    distance [n_tokens] (int32, D at answers, -1 elsewhere). An item cut off by the end is
    left as filler, so every marker is followed by its answer.
    """
    if n_values < 1 or n_filler < 1:
        raise ValueError(f"need n_values >= 1 and n_filler >= 1, got n_values {n_values}, n_filler {n_filler}")
    if not 1 <= min_distance <= max_distance:
        raise ValueError(
            f"need 1 <= min_distance <= max_distance, got min_distance {min_distance}, max_distance {max_distance}"
        )
    if max_gap < 0:
        raise ValueError(f"max_gap must be >= 0, got {max_gap}")
    if n_tokens < max_distance + max_gap + 2:
        raise ValueError(
            f"n_tokens {n_tokens} is too short for one item; need >= max_distance + max_gap + 2 = "
            f"{max_distance + max_gap + 2}"
        )
    rng = np.random.default_rng(seed)
    marker = n_filler + n_values
    tokens = rng.integers(0, n_filler, n_tokens).astype(np.int32)
    loss_mask = np.zeros(n_tokens, dtype=bool)
    distance = np.full(n_tokens, -1, dtype=np.int32)

    n_items = n_tokens // (min_distance + 2) + 1  # enough even if every item is the shortest
    gap = rng.integers(0, max_gap + 1, n_items)
    dist = rng.integers(min_distance, max_distance + 1, n_items)
    value = rng.integers(n_filler, n_filler + n_values, n_items)
    length = gap + dist + 2
    planted = np.cumsum(length) - length + gap
    answer = planted + dist + 1
    keep = answer < n_tokens
    planted, answer, dist, value = planted[keep], answer[keep], dist[keep], value[keep]

    tokens[planted] = value
    tokens[answer - 1] = marker
    tokens[answer] = value
    loss_mask[answer] = True
    distance[answer] = dist
    return tokens, loss_mask, distance


def _option_problems(options: dict) -> list[str]:
    """Why the recall options (``data.corpus.*``) cannot make the probe, each naming its key and what is valid."""
    minimum = dict(seed=0, n_values=1, n_filler=1, min_distance=1, max_distance=1, max_gap=0, train_tokens=0)
    minimum.update(eval_tokens=0)
    minimum.update({k: 1 for k in ("eval_min_distance", "eval_max_distance") if options[k] is not None})
    out = [
        f"data.corpus.{name} must be an integer >= {low}, got {options[name]!r}"
        for name, low in minimum.items()
        if isinstance(options[name], bool) or not isinstance(options[name], int) or options[name] < low
    ]
    if out:
        return out
    eval_farthest = "max_distance" if options["eval_max_distance"] is None else "eval_max_distance"
    eval_nearest = "min_distance" if options["eval_min_distance"] is None else "eval_min_distance"
    named: set[str] = set()  # a min_distance above both ranges' ends is one problem, named once
    for low, high in (("min_distance", "max_distance"), (eval_nearest, eval_farthest)):
        if options[high] < options[low] and low not in named:
            named.add(low)
            out.append(
                f"data.corpus.{low}={options[low]} is above data.corpus.{high}={options[high]}: it must be <= {high}"
            )
    for name, farthest in (("train_tokens", "max_distance"), ("eval_tokens", eval_farthest)):
        if options[name] < (need := options[farthest] + options["max_gap"] + 2):
            out.append(
                f"data.corpus.{name}={options[name]} is too short for one item: it takes >= {farthest} + max_gap + 2 "
                f"= {need} tokens"
            )
    return out


@register_corpus("recall", unit="word", answers=True)
def load_recall(
    root: Path,
    *,
    seed: int = 0,
    n_values: int = 16,
    n_filler: int = 32,
    min_distance: int = 2,
    max_distance: int = 80,
    eval_min_distance: int | None = None,
    eval_max_distance: int | None = None,
    max_gap: int = 8,
    train_tokens: int = 1_000_000,
    eval_tokens: int = 100_000,
) -> Corpus:
    """The recall probe; each split has its own seed. Cached like the others so that streams hold memmaps
    (cheap to send to DataLoader workers).

    eval_min_distance, eval_max_distance: the val/test distance range, instead of min_distance..max_distance (to
    test recall past the distances seen in training: the training range is min_distance..max_distance). The
    splits are drawn from their own seeds, so no evaluation item is a training one; those beyond max_distance
    are at distances training never saw.
    """
    given = {k: v for k, v in locals().items() if k != "root"}  # the data.corpus.* values, before any default
    if problems := _option_problems(given):
        raise ValueError(f"recall corpus: {'; '.join(problems)}")
    eval_min = min_distance if eval_min_distance is None else eval_min_distance
    eval_max = max_distance if eval_max_distance is None else eval_max_distance
    settings = dict(
        seed=seed,
        n_values=n_values,
        n_filler=n_filler,
        min_distance=min_distance,
        max_distance=max_distance,
        eval_min_distance=eval_min,
        eval_max_distance=eval_max,
        max_gap=max_gap,
        train_tokens=train_tokens,
        eval_tokens=eval_tokens,
    )

    def build():
        common = dict(n_values=n_values, n_filler=n_filler, max_gap=max_gap)
        ranges = ((min_distance, max_distance), (eval_min, eval_max), (eval_min, eval_max))
        arrays = {}
        for i, (split, n, (min_d, max_d)) in enumerate(zip(SPLITS, (train_tokens, eval_tokens, eval_tokens), ranges)):
            tokens, loss_mask, distance = make_recall(
                n, seed=[seed, i], min_distance=min_d, max_distance=max_d, **common
            )
            arrays.update({split: tokens, f"{split}.loss_mask": loss_mask, f"{split}.distance": distance})
        return arrays, recall_vocab(n_values, n_filler), {}

    # the key of before eval_min_distance when it is the default: the caches already written stay valid
    key = {"version": 1, **{k: v for k, v in settings.items() if k != "eval_min_distance" or v != min_distance}}
    arrays, itos, _ = cached(key_dir(root / "recall", key), key, build)
    side = {s: {"loss_mask": arrays[f"{s}.loss_mask"], "distance": arrays[f"{s}.distance"]} for s in SPLITS}
    # the items are drawn independently: a chunk of a few items is a unit of the report's statistics
    chunk = 4 * (max(max_distance, eval_max) + max_gap + 2)
    return Corpus(
        "recall", *(arrays[s] for s in SPLITS), vocab_size=len(itos), itos=itos, side=side, document_chunk=chunk
    )
