"""The copy task (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
Transformers"): n random symbols, then the same n symbols. ``a c b = a c b .``"""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task


@register_task("copy", space=lambda n, s: s**n, source="Kazemnejad et al. 2023")
def make_copy(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    inputs = rng.integers(0, n_symbols, (count, n))
    return inputs, inputs.copy()
