"""Addition with every number written from its units (McLeish et al. 2024, "Transformers Can Do Arithmetic with the
Right Embeddings"; the reversed format Abacus embeddings need): ``addition``'s instances with both operands and the
sum reversed, ``7 4 + 8 5 = 5 0 1 .`` for 47 + 58 = 105. The sum is produced in the order it is computed, units
first, each digit from the operands' digits of its significance and the carry of the one before.

Abacus ids (``lengthgen.py``) count each number's digits from its first written one, the units here, so a digit's
id is its significance + 1 in both operands and the sum: ``1 2 0 1 2 0 1 2 3 0``. The coupled ids are
``addition``'s rule (``task_addition.py``)."""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task
from .task_addition import add_digits, significance_ids


@register_task(
    "addition_reversed",
    space=lambda n, s: s ** (2 * n),
    extra=("+",),
    symbol_names=lambda s: [str(i) for i in range(s)],
    n_symbols=10,
    source="McLeish et al. 2024",
    couple=lambda n: significance_ids(n, operands_from_units=True),
)
def make_addition_reversed(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    a, b, total = add_digits(rng, n, count, n_symbols)
    plus = np.full((count, 1), n_symbols)
    return np.concatenate([a[:, ::-1], plus, b[:, ::-1]], axis=1), total[:, ::-1].copy()
