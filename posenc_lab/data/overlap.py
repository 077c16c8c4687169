"""Verbatim overlap between texts: which held-out tokens could be recited from the training split.

A token's *context* is the ``window`` tokens before it. ``shared_context_share(train, scored)`` is the
share of scored tokens whose context also occurs somewhere in train: text the model may have memorised
rather than predicted. ``near_duplicate_groups`` finds files that share many windows (generated tables,
copied modules), so that a corpus can keep each such family inside one split.

Windows are hashed (a polynomial hash mod 2^64: collisions among millions of windows are negligible)
and compared as sorted integer arrays: numpy only, seconds for the standard library.
"""

from __future__ import annotations

import numpy as np

WINDOW = 32


def window_hashes(tokens, window: int = WINDOW) -> np.ndarray:
    """[n - window + 1] uint64: hash of tokens[t : t + window] for every t (empty if n < window)."""
    a = np.asarray(tokens)
    if len(a) < window:
        return np.zeros(0, np.uint64)
    mult = np.uint64(1099511628211) ** np.arange(window, dtype=np.uint64)
    hashes = np.zeros(len(a) - window + 1, np.uint64)  # sum_k a[t + k] p^k mod 2^64, p the FNV prime
    for k in range(window):  # one strided pass per offset: memory O(n), not O(n * window)
        hashes += a[k : len(a) - window + 1 + k].astype(np.uint64) * mult[k]
    return hashes


def _seen(train, window: int) -> np.ndarray:
    """The sorted window hashes of ``train`` (sorting beats a hash table for tens of millions of windows)."""
    seen = window_hashes(train, window)
    seen.sort()
    return seen


def shared_context(train, scored, window: int = WINDOW) -> np.ndarray:
    """[len(scored)] bool: True where the ``window`` tokens before scored[t] also occur in ``train``
    (the first ``window`` tokens, which have no full context in ``scored``, are False)."""
    seen = _seen(train, window)
    out = np.zeros(len(scored), bool)
    if len(seen) == 0:
        return out
    contexts = window_hashes(scored, window)[:-1]  # context of token t = scored[t - window : t]
    at = np.minimum(np.searchsorted(seen, contexts), len(seen) - 1)
    out[window:] = seen[at] == contexts
    return out


def shared_context_share(train, scored, window: int = WINDOW) -> float:
    """The share of scored tokens (past the first ``window``) whose preceding ``window`` tokens occur in train."""
    if len(scored) <= window:
        return 0.0
    return float(shared_context(train, scored, window)[window:].mean())


def near_duplicate_groups(texts: list, threshold: float, window: int = WINDOW, max_files: int = 20) -> list[int]:
    """A group id per text: texts sharing at least ``threshold`` of the distinct windows of the smaller one are
    joined, transitively (union-find). Windows found in more than ``max_files`` texts (idioms such as
    ``return self``) and windows of whitespace alone do not count."""
    n = len(texts)
    per_text = []
    for t in texts:
        a = np.asarray(t)
        h = window_hashes(a, window)
        if len(h):
            blank = np.lib.stride_tricks.sliding_window_view(np.isin(a, (9, 10, 13, 32)), window).all(1)
            h = h[~blank]
        per_text.append(np.unique(h))
    hashes = np.concatenate(per_text) if per_text else np.zeros(0, np.uint64)
    owner = np.concatenate([np.full(len(h), i) for i, h in enumerate(per_text)]) if per_text else np.zeros(0, int)
    order = np.argsort(hashes, kind="stable")
    hashes, owner = hashes[order], owner[order]
    starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]]) if len(hashes) else np.zeros(0, int)
    sizes = np.diff(np.r_[starts, len(hashes)])
    pair_codes = []
    for k in range(2, max_files + 1):  # every pair of texts that share a window held by k texts
        s = starts[sizes == k]
        if len(s):
            members = owner[s[:, None] + np.arange(k)]
            i, j = np.triu_indices(k, 1)
            pair_codes.append((members[:, i] * n + members[:, j]).ravel())
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if pair_codes:
        codes, shared = np.unique(np.concatenate(pair_codes), return_counts=True)
        a, b = codes // n, codes % n
        distinct = np.array([max(len(h), 1) for h in per_text])
        joined = shared >= threshold * np.minimum(distinct[a], distinct[b])
        for x, y in zip(a[joined], b[joined]):
            parent[find(int(x))] = find(int(y))
    return [find(i) for i in range(n)]
