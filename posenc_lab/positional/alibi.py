"""ALiBi (Press et al. 2022): add -m_h * (i - j) to the scores, m_h fixed geometric slopes per head."""

import math

import torch
from torch import Tensor

from .base import Dims, DistanceBias, PositionalScheme, Positions
from .registry import register


def alibi_slopes(n_head: int) -> Tensor:
    """[H] slopes 2^(-8/n), 2^(-16/n), ...; for n not a power of two, interleave as in the paper."""

    def geometric(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(closest)
    if closest < n_head:
        slopes += geometric(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


@register
class ALiBi(PositionalScheme):
    name = "alibi"
    kind = "relative"
    family = "relative bias"
    positions_enter = "`-m_h (i - j)`"
    with_memory = "works"

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_head), persistent=False)

    def table(self, d: Tensor) -> Tensor:
        """d: [...] distances -> [H, ...] -m_h d."""
        return -self.slopes.view((-1,) + (1,) * d.dim()) * d.to(self.slopes.dtype)

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> DistanceBias:
        return DistanceBias(self.table)  # -m_h (i - j)
