"""xPos (Sun et al. 2022): RoPE with an exponential decay that keeps long-range attention stable.

RoPE's rotation (``rope.py``: channel pairs (c, c + d_h/2), theta_c = base^{-2c/d_h}), and besides each
pair c of the query scaled by zeta_c^{i/B} and of the key by zeta_c^{-j/B}:

    zeta_c = (2c / d_h + gamma) / (1 + gamma)          in (gamma/(1+gamma), 1): gamma = 0.4 gives 0.29 .. 1
    q_i . k_j  ->  sum_c zeta_c^{(i-j)/B} (the rotated pair product of c)

so every pair's contribution decays geometrically with the distance i - j, the low-frequency pairs (large c,
zeta near 1) the least. gamma and the scale base B = 512 are the paper's. The scores depend on i - j only;
each factor alone grows as zeta^{-j/B} with the key position, so the exponents are taken about the middle
of the segment's span (as the authors' code centres its positions): with memory, keys run from -M, and
the largest factor is zeta_min^{-(M+L)/(2B)}. Memory keys sit at their true negative positions. The
paper's blockwise causal attention at inference is what the memory with M = L already is.
"""

import torch
from torch import Tensor

from .base import Dims, Positions
from .registry import register
from .rope import RoPE, rotate_half


@register
class XPos(RoPE):
    name = "xpos"
    family = "relative, rotary with decay"
    positions_enter = "RoPE times `zeta^((i-j)/B)`"
    with_memory = "as rope"

    def __init__(self, dims: Dims, *, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0):
        super().__init__(dims, base=base)
        for option, value in (("gamma", gamma), ("scale_base", scale_base)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"xpos: {option} must be a number > 0, got {value!r}")
        self.gamma, self.scale_base = float(gamma), float(scale_base)
        zeta = (torch.arange(0, dims.d_head, 2, dtype=torch.float32) / dims.d_head + gamma) / (1 + gamma)
        self.register_buffer("log_zeta", torch.cat([zeta, zeta]).log(), persistent=False)  # [d_h], per channel

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        return dict(options)  # none of RoPE's scaling options, so nothing to size

    def decay(self, positions: Tensor, centre: Tensor, dtype: torch.dtype) -> Tensor:
        """[P, d_h] zeta_c^{(p - centre)/B}."""
        return torch.exp((positions.to(torch.float32) - centre)[:, None] / self.scale_base * self.log_zeta).to(dtype)

    def rotate(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self._cos_sin(pos.q, q.dtype)
        cos_k, sin_k = self._cos_sin(pos.k, k.dtype)
        centre = (pos.k[0] + pos.q[-1]).to(torch.float32) / 2  # the exponents' zero: the middle of the span
        q = (q * cos_q + rotate_half(q) * sin_q) * self.decay(pos.q, centre, q.dtype)  # zeta^{+i/B}
        k = (k * cos_k + rotate_half(k) * sin_k) / self.decay(pos.k, centre, k.dtype)  # zeta^{-j/B}
        return q, k

    def extra_repr(self) -> str:
        return f"base={self.base}, gamma={self.gamma}, scale_base={self.scale_base}"
