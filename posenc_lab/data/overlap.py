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
CHUNK = 1 << 20  # windows hashed at a time: the temporaries stay a few MB whatever the text's size


def window_hashes(tokens, window: int = WINDOW) -> np.ndarray:
    """[n - window + 1] uint64: hash of tokens[t : t + window] for every t (empty if n < window)."""
    a = np.asarray(tokens)
    if len(a) < window:
        return np.zeros(0, np.uint64)
    mult = np.uint64(1099511628211) ** np.arange(window, dtype=np.uint64)
    n = len(a) - window + 1
    hashes = np.zeros(n, np.uint64)  # sum_k a[t + k] p^k mod 2^64, p the FNV prime
    term = np.empty(min(n, CHUNK), np.uint64)  # one bounded temporary: memory 8 bytes a token, not 24
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        out, part = hashes[start:stop], term[: stop - start]
        for k in range(window):  # one strided pass per offset, never a [n, window] array
            np.multiply(a[start + k : stop + k], mult[k], out=part, casting="unsafe")
            out += part
    return hashes


def _distinct_windows(text, window: int) -> np.ndarray:
    """The sorted distinct window hashes of ``text``, windows of whitespace alone left out (peak memory: about
    17 bytes a token)."""
    a = np.asarray(text)
    if len(a) < window:
        return np.zeros(0, np.uint64)
    dtype = np.int32 if len(a) < 2**31 else np.int64
    seen = np.zeros(len(a) + 1, dtype)  # seen[t]: tokens before t that are not whitespace
    np.cumsum(~np.isin(a, (9, 10, 13, 32)), dtype=dtype, out=seen[1:])
    counted = seen[window:] != seen[: len(a) - window + 1]  # a window of whitespace alone adds none
    del seen
    h = window_hashes(a, window)[counted]
    h.sort()
    return h[np.r_[True, h[1:] != h[:-1]]] if len(h) else h


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
    ``return self``) and windows of whitespace alone do not count. Memory: about 17 bytes a token of the largest
    text while its windows are hashed, then 16 bytes a distinct window of all texts (a table of every window
    took 6.4 GB for 81 MB)."""
    n = len(texts)
    parent = list(range(n))
    if n < 2:  # no pair to join
        return parent
    per_text = [_distinct_windows(t, window) for t in texts]
    # the windows held by 2..max_files texts (each text's windows are distinct), found on one sorted copy; only
    # they are gathered with their texts
    every = np.concatenate(per_text)
    every.sort()
    again = np.flatnonzero(every[1:] == every[:-1])  # a window's second, third, ... copy (few: indices of them only)
    first = np.r_[True, again[1:] != again[:-1] + 1] if len(again) else np.zeros(0, bool)
    copies = np.diff(np.r_[np.flatnonzero(first), len(again)]) + 1  # texts holding each repeated window
    shared = every[again[first][copies <= max_files]]
    del every, again, first, copies
    hashes, owner = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for i, h in enumerate(per_text):
        if len(shared) and len(h):
            at = np.searchsorted(shared, h)
            at[at == len(shared)] = 0
            h = h[shared[at] == h]
            hashes.append(h)
            owner.append(np.full(len(h), i, np.int64))
    hashes, owner = np.concatenate(hashes), np.concatenate(owner)
    order = np.argsort(hashes, kind="stable")  # stable: the texts of a window in text order
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

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if pair_codes:
        codes, shared_windows = np.unique(np.concatenate(pair_codes), return_counts=True)
        a, b = codes // n, codes % n
        distinct = np.array([max(len(h), 1) for h in per_text])
        joined = shared_windows >= threshold * np.minimum(distinct[a], distinct[b])
        for x, y in zip(a[joined], b[joined]):
            parent[find(int(x))] = find(int(y))
    return [find(i) for i in range(n)]
