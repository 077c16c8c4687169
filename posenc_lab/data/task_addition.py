"""Multi-digit addition (Kazemnejad et al. 2023): two n-digit operands in base ``n_symbols`` (10: decimal), most
significant digit first, no scratchpad, then their sum. ``4 7 + 5 8 = 1 0 5 .`` The length is n, the operands'
digits (a leading digit may be 0). The sum is written with n + 1 digits (a leading 0 where nothing carries), so
every instance of one length has one size."""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task


@register_task(
    "addition",
    space=lambda n, s: s ** (2 * n),
    extra=("+",),
    symbol_names=lambda s: [str(i) for i in range(s)],
    n_symbols=10,
    source="Kazemnejad et al. 2023",
)
def make_addition(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    a, b = rng.integers(0, n_symbols, (2, count, n))
    total = np.zeros((count, n + 1), dtype=np.int64)
    carry = np.zeros(count, dtype=np.int64)
    for i in range(n - 1, -1, -1):  # digit by digit from the least significant: no integer overflow at any n
        s = a[:, i] + b[:, i] + carry
        total[:, i + 1], carry = s % n_symbols, s // n_symbols
    total[:, 0] = carry
    plus = np.full((count, 1), n_symbols)  # the task's own token "+", right after the digits
    return np.concatenate([a, plus, b], axis=1), total
