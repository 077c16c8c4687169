"""Absolute sinusoid, reset per segment (Vaswani et al. 2017).

h^0_i = E[x_i] + PE(i),  i in [0, L).  With memory, cached states carry the positions of *their*
segment: position 3 of segment t and of segment t+1 look the same ("position confusion").
"""

from torch import Tensor

from .base import PositionalScheme, Positions, sinusoid_table
from .registry import register


@register
class Sinusoid(PositionalScheme):
    name = "sinusoid"
    kind = "absolute"
    family = "absolute, reset per segment"
    positions_enter = "`E[x_i] + PE(i)`"
    with_memory = "memory states carry their own segment's positions"

    def embed(self, h: Tensor, pos: Positions) -> Tensor:
        return h + sinusoid_table(pos.q, self.dims.d_model).to(h.dtype)  # + PE(i)
