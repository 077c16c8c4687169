"""RoPE (Su et al. 2021): rotate q_i and k_j by angles proportional to their positions.

Pairs of channels (c, c + d_h/2) turn by angle p * theta_c, theta_c = base^{-2c/d_h}, so
q_i . k_j depends on i - j only. Memory keys sit at negative positions -M..-1.
"""

import math

import torch
from torch import Tensor

from .base import Dims, PositionalScheme, Positions
from .registry import register


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


@register
class RoPE(PositionalScheme):
    name = "rope"
    kind = "relative"

    def __init__(self, dims: Dims, *, base: float = 10000.0):
        super().__init__(dims)
        if dims.d_head % 2:
            raise ValueError(f"rope: the head size d_model/n_head = {dims.d_head} is odd; rope needs an even head size")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
            # base <= 0 gives NaN angles (the loss diverges at step 0), 1 the same angle for every channel pair
            raise ValueError(f"rope: posenc.base must be a number > 1 (10000 in Su et al. 2021), got {base!r}")
        self.base = base
        self.register_buffer(
            "inv_freq", base ** (-torch.arange(0, dims.d_head, 2, dtype=torch.float32) / dims.d_head), persistent=False
        )

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq  # [P, d_h/2]: p * theta_c
        angles = torch.cat([angles, angles], dim=-1)  # [P, d_h]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, layer: int, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self._cos_sin(pos.q, q.dtype)
        cos_k, sin_k = self._cos_sin(pos.k, k.dtype)
        # x * cos + rotate_half(x) * sin  is the 2-D rotation of each channel pair.
        return q * cos_q + rotate_half(q) * sin_q, k * cos_k + rotate_half(k) * sin_k

    def extra_repr(self) -> str:
        return f"base={self.base}"
