"""Sandwich (Chi et al. 2023): the inner product of the sinusoids of i and j, used as a fixed score bias.

With PE the sinusoid of ``d_bar`` channels ([sin ; cos], frequencies w_k = 10000^{-2k/d_bar}):

    PE(i) . PE(j) = sum_k cos(w_k (i - j))                      (a function of d = i - j alone)
    b_h(i, j)     = (PE(i) . PE(j) - d_bar / 2) / (8 h / H),     h = 1..H
    scores_ij     = q_i . k_j / sqrt(d_h) + b_h(i, j)

The inner product is d_bar/2 at d = 0 and falls, log-like with ripples, with the distance; subtracting d_bar/2
makes the bias 0 on the diagonal and negative elsewhere, and the head scale spreads the heads' ranges as
ALiBi's slopes do. Nothing is learned. Choices the paper leaves open, taken from NeMo's implementation:
the d_bar/2 shift, the head scale 8h/H, and d_bar = the head size by default (``dim`` sets it). No [L, N, d_bar]
tensor is built: the bias is a table over the distances, indexed per pair.
"""

import torch
from torch import Tensor

from .base import Dims, DistanceBias, PositionalScheme, Positions, sinusoid_table
from .registry import register


@register
class Sandwich(PositionalScheme):
    name = "sandwich"
    kind = "relative"
    family = "relative bias"
    positions_enter = "`PE(i).PE(j)` shifted and scaled per head"
    with_memory = "works"
    fused_from_keys = None  # not measured on a GPU: a fixed bias like alibi's, for which SDPA beat flex

    def __init__(self, dims: Dims, *, dim: int | None = None):
        super().__init__(dims)
        dim = dims.d_head if dim is None else dim
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(
                f"sandwich: dim (d_bar, the sinusoid's channels) must be an even integer >= 2, got {dim!r}"
            )
        self.dim = dim
        heads = torch.arange(1, dims.n_head + 1, dtype=torch.float32)
        self.register_buffer("head_scale", 8 * heads / dims.n_head, persistent=False)  # 8h/H

    def table(self, d: Tensor) -> Tensor:
        """d: [D] distances -> [H, D] b_h(d)."""
        pe_dot = sinusoid_table(d, self.dim)[:, self.dim // 2 :].sum(-1)  # sum_k cos(w_k d): PE(d)'s cos half
        return (pe_dot - self.dim / 2) / self.head_scale[:, None]

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> DistanceBias:
        table = self.table(torch.arange(pos.max_distance + 1, device=pos.q.device))  # [H, D + 1], column d
        return DistanceBias(lambda d: table[:, d])  # read at each distance, not rebuilt per pair

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
