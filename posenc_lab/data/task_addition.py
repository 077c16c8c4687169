"""Multi-digit addition (Kazemnejad et al. 2023): two n-digit operands in base ``n_symbols`` (10: decimal), most
significant digit first, no scratchpad, then their sum. ``4 7 + 5 8 = 1 0 5 .`` The length is n, the operands'
digits (a leading digit may be 0). The sum is written with n + 1 digits (a leading 0 where nothing carries), so
every instance of one length has one size: the zero-padded operands of Cho et al. 2024.

Coupled positions (Cho et al. 2024, position coupling), for this task and ``addition_reversed``: a digit of
significance k (0: the units) has id n + 1 - k in either operand and in the sum, whichever order it is written in,
so the digits one step of the sum reads share an id; ``+`` and ``=`` have n + 2, one past the units; the end 0.
``4 7 + 5 8 = 1 0 5 .`` -> ``2 3 4 2 3 4 1 2 3 0`` (n = 2). The authors draw the start from 1..max_position - n
in training and take 1 at test; here the data's ``position_shift`` draws it (``lengthgen.py``)."""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task


def significance_ids(n: int, operands_from_units: bool) -> np.ndarray:
    """Coupled position ids of an instance of length n (module doc): operands written from their most significant
    digit, or (``operands_from_units``) from their units, the sum as its operands."""
    ids = np.arange(2, n + 2)  # significance n - 1 .. 0, as written most significant first
    total = np.arange(1, n + 2)  # the sum's n + 1 digits: significance n .. 0
    if operands_from_units:
        ids, total = ids[::-1], total[::-1]
    return np.concatenate([ids, [n + 2], ids, [n + 2], total, [0]])


def add_digits(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    """(a, b, total): [count, n], [count, n], [count, n + 1] digits of two random operands and their sum, most
    significant first."""
    a, b = rng.integers(0, n_symbols, (2, count, n))
    total = np.zeros((count, n + 1), dtype=np.int64)
    carry = np.zeros(count, dtype=np.int64)
    for i in range(n - 1, -1, -1):  # digit by digit from the least significant: no integer overflow at any n
        s = a[:, i] + b[:, i] + carry
        total[:, i + 1], carry = s % n_symbols, s // n_symbols
    total[:, 0] = carry
    return a, b, total


def register_addition(name: str, source: str, from_units: bool):
    """Register addition as task ``name``: numbers written from their most significant digit, or (``from_units``)
    every number, operands and sum, from its units; its coupled ids by significance either way."""

    @register_task(
        name,
        space=lambda n, s: s ** (2 * n),
        extra=("+",),
        symbol_names=lambda s: [str(i) for i in range(s)],
        n_symbols=10,
        source=source,
        couple=lambda n: significance_ids(n, operands_from_units=from_units),
    )
    def make(rng: np.random.Generator, n: int, count: int, n_symbols: int):
        a, b, total = add_digits(rng, n, count, n_symbols)
        if from_units:
            a, b, total = a[:, ::-1], b[:, ::-1], total[:, ::-1].copy()
        plus = np.full((count, 1), n_symbols)  # the task's own token "+", right after the digits
        return np.concatenate([a, plus, b], axis=1), total

    return make


make_addition = register_addition("addition", "Kazemnejad et al. 2023", from_units=False)
