"""Duplicate string (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", a context-sensitive task of the Chomsky hierarchy of Deletang et al. 2023): n random symbols, then
them twice. ``a c b = a c b a c b .`` The answer is twice the input's length: the second copy lies 2n + 1 tokens
after its source."""

from __future__ import annotations

import numpy as np

from .lengthgen import register_task


@register_task("duplicate_string", space=lambda n, s: s**n, source="Ruoss et al. 2023")
def make_duplicate(rng: np.random.Generator, n: int, count: int, n_symbols: int):
    inputs = rng.integers(0, n_symbols, (count, n))
    return inputs, np.concatenate([inputs, inputs], axis=1)
