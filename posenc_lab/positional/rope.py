"""RoPE (Su et al. 2021): rotate q_i and k_j by angles proportional to their positions.

Pairs of channels (c, c + d_h/2) turn by angle p * theta_c, theta_c = base^{-2c/d_h}, so
q_i . k_j depends on i - j only. Memory keys sit at negative positions -M..-1.

``scaling`` stretches the rotation to evaluate past the trained length (``factor`` s >= 1 times it),
each a change of theta_c (and, for YaRN, of the scores' temperature):

    none    theta_c
    linear  theta_c / s                                     position interpolation (Chen et al. 2023)
    ntk     (base s^{d_h/(d_h-2)})^{-2c/d_h}                 NTK-aware: a larger base (bloc97, 2023)
    yarn    (1 - g_c) theta_c / s + g_c theta_c,  g_c = clip((r_c - alpha) / (beta - alpha), 0, 1),
            r_c = L_orig theta_c / (2 pi), alpha = 1, beta = 32; q and k times 0.1 ln(s) + 1  (Peng et al. 2023)

YaRN's r_c counts how many turns channel pair c makes over the trained span L_orig (``original_len``):
pairs that turn many times (g = 1) keep theta, pairs that turn less than once (g = 0) are interpolated, and
the temperature makes up for the flatter softmax of the longer context. L_orig is the attention span the
model trained with, M + L (the largest distance it saw plus one); null sizes it to the run, so a checkpoint
carries it into evaluation. alpha, beta and the temperature are the paper's values for LLaMA.
"""

import math

import torch
from torch import Tensor

from .base import Dims, PositionalScheme, Positions
from .registry import register

SCALINGS = ("none", "linear", "ntk", "yarn")
YARN_ALPHA, YARN_BETA = 1.0, 32.0


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def scaled_inv_freq(d_head: int, base: float, scaling: str, factor: float, original_len: int | None) -> Tensor:
    """[d_h/2] theta_c of ``scaling`` (see the module docstring)."""
    if scaling == "ntk":
        base = base * factor ** (d_head / (d_head - 2))
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # base^{-2c/d_h}
    if scaling == "linear":
        theta = theta / factor
    if scaling == "yarn":
        turns = original_len * theta / (2 * math.pi)  # r_c
        keep = ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)  # g_c
        theta = (1 - keep) * theta / factor + keep * theta
    return theta


@register
class RoPE(PositionalScheme):
    name = "rope"
    kind = "relative"

    def __init__(
        self,
        dims: Dims,
        *,
        base: float = 10000.0,
        scaling: str = "none",
        factor: float = 1.0,
        original_len: int | None = None,
    ):
        super().__init__(dims)
        if dims.d_head % 2:
            raise ValueError(f"rope: the head size d_model/n_head = {dims.d_head} is odd; rope needs an even head size")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
            # base <= 0 gives NaN angles (the loss diverges at step 0), 1 the same angle for every channel pair
            raise ValueError(f"rope: posenc.base must be a number > 1 (10000 in Su et al. 2021), got {base!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"rope: scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
            raise ValueError(f"rope: factor (how many times the trained length to reach) must be >= 1, got {factor!r}")
        if scaling == "none" and factor != 1:
            raise ValueError(f"rope: factor={factor!r} has no effect with scaling=none; pick linear, ntk or yarn")
        if original_len is not None and (isinstance(original_len, bool) or not isinstance(original_len, int)):
            raise ValueError(f"rope: original_len must be an integer >= 1 or null, got {original_len!r}")
        if scaling == "yarn" and (original_len is None or original_len < 1):
            raise ValueError(
                f"rope: scaling=yarn needs original_len, the attention span trained with (M + L), got {original_len!r}"
            )
        self.base, self.scaling, self.factor, self.original_len = base, scaling, float(factor), original_len
        inv_freq = scaled_inv_freq(dims.d_head, base, scaling, self.factor, original_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # YaRN's temperature, sqrt(1/t) = 0.1 ln(s) + 1 on q and on k: the scores times (0.1 ln s + 1)^2
        self.qk_scale = 0.1 * math.log(self.factor) + 1.0 if scaling == "yarn" else 1.0

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """original_len=None -> segment_len + mem_len, the span of keys the run trains with."""
        if options.get("original_len") is None:
            return {**options, "original_len": segment_len + mem_len}
        return dict(options)

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq  # [P, d_h/2]: p * theta_c
        angles = torch.cat([angles, angles], dim=-1)  # [P, d_h]
        return (angles.cos() * self.qk_scale).to(dtype), (angles.sin() * self.qk_scale).to(dtype)

    def rotate(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self._cos_sin(pos.q, q.dtype)
        cos_k, sin_k = self._cos_sin(pos.k, k.dtype)
        # x * cos + rotate_half(x) * sin  is the 2-D rotation of each channel pair.
        return q * cos_q + rotate_half(q) * sin_q, k * cos_k + rotate_half(k) * sin_k

    def extra_repr(self) -> str:
        scaled = f", scaling={self.scaling!r}, factor={self.factor}" if self.scaling != "none" else ""
        return f"base={self.base}{scaled}"
