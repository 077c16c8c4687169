"""The reverse task (Kazemnejad et al. 2023; "reverse string" in Ruoss et al. 2023's Chomsky hierarchy): n random
symbols, then the same n in reverse order. ``a c b = b c a .``"""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task


@register_task("reverse", space=lambda n, s: s**n, source="Kazemnejad et al. 2023; Ruoss et al. 2023")
def make_reverse(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    inputs = rng.integers(0, n_symbols, (count, n))
    return inputs, inputs[:, ::-1].copy()
