"""Learned absolute positions, reset per segment: h^0_i = E[x_i] + P[i], P a [max_positions, D] table.

It cannot extrapolate: a position >= max_positions is a configuration error, raised before training
(``validate``) and again at the forward pass. ``overflow="clamp"`` reuses the last row instead; it
exists for analysis only and must be asked for explicitly. ``max_positions=None`` (the config's default)
sizes the table to the run's segment length (``sized_options``), the longest position it trains on.
"""

import torch
from torch import Tensor, nn

from .base import Dims, PositionalScheme, Positions
from .registry import register


@register
class Learned(PositionalScheme):
    name = "learned"
    kind = "absolute"
    family = "absolute, reset per segment"
    positions_enter = "`E[x_i] + P[i]`, a table"
    with_memory = "as sinusoid; positions past the table fail before training"

    def __init__(self, dims: Dims, *, max_positions: int | None = None, overflow: str = "error"):
        super().__init__(dims)
        if max_positions is None:
            raise ValueError(
                "learned: max_positions=None must be sized to the run before the table is built "
                "(posenc_lab.positional.sized_options, as training does), or set an integer"
            )
        if not isinstance(max_positions, int) or isinstance(max_positions, bool) or max_positions < 1:
            raise ValueError(f"learned: max_positions must be a positive integer, got {max_positions!r}")
        if overflow not in ("error", "clamp"):
            raise ValueError(f"learned: overflow must be 'error' or 'clamp', got {overflow!r}")
        self.max_positions, self.overflow = max_positions, overflow
        self.table = nn.Parameter(torch.randn(max_positions, dims.d_model) * 0.02)  # P

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """max_positions=None -> segment_len: positions restart at 0 every segment (memory keys carry none)."""
        if options.get("max_positions") is None:
            return {**options, "max_positions": segment_len}
        return dict(options)

    def _check(self, largest: int) -> None:
        if largest >= self.max_positions and self.overflow == "error":
            raise ValueError(
                f"learned: position {largest} is past the table of max_positions={self.max_positions} "
                f"(valid positions 0..{self.max_positions - 1}); raise posenc.max_positions to at least "
                f"{largest + 1}, shorten the segment, or set posenc.overflow=clamp for analysis"
            )

    def validate(self, segment_len: int, mem_len: int, max_offset: int = 0) -> None:
        self._check(segment_len - 1)

    def embed(self, h: Tensor, pos: Positions) -> Tensor:
        # consecutive: q = 0..L-1, read from the shape (no host read of the device, no graph break)
        self._check(pos.q.shape[0] - 1 if pos.consecutive else int(pos.q.max()))
        index = pos.q.clamp(max=self.max_positions - 1)
        return h + self.table[index].to(h.dtype)  # + P[i]

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, overflow={self.overflow!r}"
