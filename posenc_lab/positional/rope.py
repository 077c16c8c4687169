"""RoPE (Su et al. 2021): rotate q_i and k_j by angles proportional to their positions.

Pairs of channels (c, c + d_h/2) turn by angle p * theta_c, theta_c = base^{-2c/d_h}, so
q_i . k_j depends on i - j only. Memory keys sit at negative positions -M..-1.

``partial`` p (p-RoPE, Barbero et al. 2025) rotates only the R = floor(p d_h / 2) highest-frequency pairs,
c < R, with their own theta_c; the other pairs keep theta_c = 0 (never rotated: a position-free channel that
attention can use for content at any distance). p = 1 is RoPE, p = 0 no rotation at all. R rounds down as the
authors' Gemma code does (``int(rope_proportion * head_dim // 2)``).

``scaling`` stretches the rotation to evaluate past the trained length (``factor`` s >= 1 times it),
each a change of theta_c (and, for YaRN, of the scores' temperature):

    none    theta_c
    linear  theta_c / s                                     position interpolation (Chen et al. 2023)
    ntk     (base s^{d_h/(d_h-2)})^{-2c/d_h}                 NTK-aware: a larger base (bloc97, 2023)
    yarn    (1 - g_c) theta_c / s + g_c theta_c,  g_c = clip((r_c - alpha) / (beta - alpha), 0, 1),
            r_c = L_orig theta_c / (2 pi), alpha = 1, beta = 32; q and k times 0.1 ln(s) + 1  (Peng et al. 2023)
    llama3  the same blend with alpha = low_freq_factor, beta = high_freq_factor (1 and 4), no temperature
            (Llama 3.1's apply_scaling)

r_c counts how many turns channel pair c makes over the trained span L_orig (``original_len``), i.e. L_orig over
its wavelength 2 pi / theta_c: pairs that turn many times (g = 1) keep theta, pairs that turn less than alpha
times (g = 0) are interpolated, those in between are blended; YaRN's temperature makes up for the flatter
softmax of the longer context. Llama 3.1's code states it by wavelength (kept below L_orig / high_freq_factor,
divided by s above L_orig / low_freq_factor, smooth = (L_orig / wavelength - low) / (high - low) between), which
is this ramp. L_orig is the attention span the model trained with, M + L (the largest distance it saw plus one);
null sizes it to the run, so a checkpoint carries it into evaluation (Llama 3.1's is 8192, its factor 8).
YaRN's alpha, beta and temperature are the paper's values for LLaMA.
"""

import math

import torch
from torch import Tensor

from .base import Dims, PositionalScheme, Positions
from .registry import register

SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")
YARN_ALPHA, YARN_BETA = 1.0, 32.0


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def scaled_inv_freq(
    d_head: int,
    base: float,
    scaling: str,
    factor: float,
    original_len: int | None,
    partial: float = 1.0,
    ramp: tuple[float, float] = (YARN_ALPHA, YARN_BETA),
) -> Tensor:
    """[d_h/2] theta_c of ``scaling`` (see the module docstring); ``ramp``: llama3's (low, high) freq factors."""
    if scaling == "ntk":
        base = base * factor ** (d_head / (d_head - 2))
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # base^{-2c/d_h}
    if scaling == "linear":
        theta = theta / factor
    if scaling in ("yarn", "llama3"):
        alpha, beta = (YARN_ALPHA, YARN_BETA) if scaling == "yarn" else ramp
        turns = original_len * theta / (2 * math.pi)  # r_c
        keep = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)  # g_c
        theta = (1 - keep) * theta / factor + keep * theta
    rotated = int(partial * d_head // 2)  # R: the highest-frequency pairs c < R turn, the rest never do
    return torch.where(torch.arange(d_head // 2) < rotated, theta, 0.0)


@register
class RoPE(PositionalScheme):
    name = "rope"
    kind = "relative"

    def __init__(
        self,
        dims: Dims,
        *,
        base: float = 10000.0,
        partial: float = 1.0,
        scaling: str = "none",
        factor: float = 1.0,
        original_len: int | None = None,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
    ):
        super().__init__(dims)
        if dims.d_head % 2:
            raise ValueError(f"rope: the head size d_model/n_head = {dims.d_head} is odd; rope needs an even head size")
        if not math.isfinite(base) or base <= 1:
            # base <= 0 gives NaN angles (the loss diverges at step 0), 1 the same angle for every channel pair
            raise ValueError(f"rope: posenc.base must be a number > 1 (10000 in Su et al. 2021), got {base!r}")
        if not 0 <= partial <= 1:
            raise ValueError(
                f"rope: posenc.partial (the fraction of channel pairs rotated: 1 = RoPE, 0 = none) must be in "
                f"[0, 1], got {partial!r}"
            )
        if scaling not in SCALINGS:
            raise ValueError(f"rope: scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
        if not factor >= 1:
            raise ValueError(f"rope: factor (how many times the trained length to reach) must be >= 1, got {factor!r}")
        if scaling == "none" and factor != 1:
            raise ValueError(
                f"rope: factor={factor!r} has no effect with scaling=none; pick one of {', '.join(SCALINGS[1:])}"
            )
        if scaling != "llama3" and (low_freq_factor, high_freq_factor) != (1.0, 4.0):
            raise ValueError(
                f"rope: low_freq_factor={low_freq_factor!r}, high_freq_factor={high_freq_factor!r} have no effect with "
                f"scaling={scaling}; they shape scaling=llama3"
            )
        if not 0 < low_freq_factor < high_freq_factor:
            raise ValueError(
                f"rope: llama3 needs 0 < low_freq_factor < high_freq_factor (Llama 3.1: 1 and 4), got "
                f"{low_freq_factor!r} and {high_freq_factor!r}"
            )
        if scaling in ("yarn", "llama3") and (original_len is None or original_len < 1):
            raise ValueError(
                f"rope: scaling={scaling} needs original_len, the attention span trained with (M + L), "
                f"got {original_len!r}"
            )
        self.base, self.partial, self.scaling, self.factor = base, float(partial), scaling, float(factor)
        self.original_len, self.ramp = original_len, (float(low_freq_factor), float(high_freq_factor))
        inv_freq = scaled_inv_freq(dims.d_head, base, scaling, self.factor, original_len, self.partial, self.ramp)
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
        partial = f", partial={self.partial}" if self.partial != 1 else ""
        return f"base={self.base}{partial}{scaled}"
