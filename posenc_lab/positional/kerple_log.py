"""KERPLE, logarithmic variant (Chi et al. 2022): a learned kernel of the distance as a score bias.

KERPLE adds to the scores a conditionally positive definite kernel of the distance d = i - j >= 0,
made shift-invariant and negative. Per layer and head h, two learned scalars r1, r2 > 0:

    b_h(i, j) = -r1_h log(1 + r2_h (i - j))                                  (this module)
    scores_ij = q_i . k_j / sqrt(d_h) + b_h(i, j)

``kerple_power`` subclasses this module and overrides ``kernel`` alone: -r1 (i - j)^r2, 0 < r2 <= 2.

Choices the paper leaves to its code (the authors' gpt-neox code, followed here): one (r1, r2) pair per head
in every layer; the constraints r1, r2 >= 0.01 (and r2 <= 2 for the power) held by projection, i.e. clamped in
place before each use, not by a reparametrisation; initial values uniform, r1 in [0, 2) and r2 in [0, 1) for
the log kernel (r1 in [0, 1), r2 in [0, 2) for the power), so that heads start at different ranges. Memory
keys sit at their true negative positions, so their distances run past L as in one long sequence.
"""

from functools import partial

import torch
from torch import Tensor, nn

from .base import Dims, DistanceBias, PositionalScheme, Positions
from .registry import register

EPS = 1e-2  # the authors' lower bound of r1 and r2


@register
class KerpleLog(PositionalScheme):
    name = "kerple_log"
    kind = "relative"
    family = "relative bias"
    positions_enter = "`-r1 log(1 + r2 d)`, r1 and r2 learned per head"
    with_memory = "works"
    # not measured on a GPU: a learned bias like t5's, whose gradient SDPA cannot give (t5: fused 0.46x unfused)
    fused_from_keys = 0
    #: r1 ~ U(0, init[0]), r2 ~ U(0, init[1]), then kept inside their bounds (low, high)
    init = (2.0, 1.0)
    projected = {"r1": (EPS, None), "r2": (EPS, None)}

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.r1 = nn.Parameter(torch.rand(dims.n_layer, dims.n_head) * self.init[0])
        self.r2 = nn.Parameter(torch.rand(dims.n_layer, dims.n_head) * self.init[1])

    @staticmethod
    def kernel(r1: Tensor, r2: Tensor, d: Tensor) -> Tensor:
        """-r1 log(1 + r2 d), broadcast."""
        return -r1 * torch.log1p(r2 * d)

    def bias(self, layer: int, d: Tensor) -> Tensor:
        """d: [...] distances >= 0 -> [H, ...] b_h(d), with r1, r2 projected into their bounds first."""
        r1, r2 = self.constrained("r1")[layer], self.constrained("r2")[layer]
        shape = (-1,) + (1,) * d.dim()
        return self.kernel(r1.view(shape), r2.view(shape), d.to(r1.dtype))

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> DistanceBias:
        return DistanceBias(partial(self.bias, layer))  # b_h(i - j)
