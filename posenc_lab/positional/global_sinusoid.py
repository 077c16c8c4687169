"""Absolute sinusoid whose positions keep counting across segments of a stream.

h^0_i = E[x_i] + PE(s + i), s = the stream offset of the segment (reset at an episode start).
Memory keeps true global positions (no confusion), but positions grow without bound: past the
offsets seen in training the model meets positions it never saw (horizon extrapolation).
"""

from torch import Tensor

from .base import PositionalScheme, Positions, sinusoid_table
from .registry import register


@register
class GlobalSinusoid(PositionalScheme):
    name = "global_sinusoid"
    kind = "absolute"
    family = "absolute, counting across segments"
    positions_enter = "`E[x_i] + PE(s + i)`"
    with_memory = "true positions; unseen offsets past the training episodes"
    random_positions_refused = (
        "its positions are the stream offset s + i, counted across segments: a random subset drawn per segment "
        "would not keep a stream's positions increasing from one segment to the next, and the unbounded count "
        "is what this scheme exists to measure (the horizon axis)"
    )

    def embed(self, h: Tensor, pos: Positions) -> Tensor:
        global_pos = pos.offset[:, None] + pos.q[None, :]  # [B, L]: s + i
        return h + sinusoid_table(global_pos, self.dims.d_model).to(h.dtype)  # + PE(s + i)
