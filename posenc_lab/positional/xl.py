"""Transformer-XL relative encoding (Dai et al. 2019).

No input encoding. R_d = PE(d) for the distance d = i - j (fixed sinusoid), projected per layer by
W_{k,R}; learned u, v (per head) replace the query's absolute position:

    A_ij = (q_i + u) . k_j  +  (q_i + v) . (W_{k,R} R_{i-j}),   scaled by 1/sqrt(d_h)
           [(a) + (c)]          [(b) + (d)]

(a)+(c) is plain attention with query q + u, so it goes through SDPA; (b)+(d) is computed once per
layer for the N = M + L distances, [.., L, N], aligned by the relative shift, and handed to SDPA
as an additive bias. No [L, N, D] tensor of R vectors is ever built.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, Positions, PositionalScheme, mask_to_bias, sinusoid_table
from .registry import register


def relative_shift(x: Tensor) -> Tensor:
    """x: [.., L, N] with column c holding distance N-1-c  ->  [.., L, N] with (i, j) holding M + i - j.

    Pad one zero column on the left, view as [.., N+1, L], drop the first row, view back.
    Entries with j > M + i (future keys) are garbage and must be masked.
    """
    *lead, L, N = x.shape
    padded = F.pad(x, (1, 0))  # [.., L, N+1]
    return padded.view(*lead, N + 1, L)[..., 1:, :].reshape(*lead, L, N)


@register
class XLRelative(PositionalScheme):
    name = "xl"

    def __init__(self, dims: Dims, *, clamp_len: int | None = None, share_uv: bool = True):
        super().__init__(dims)
        if clamp_len is not None and (not isinstance(clamp_len, int) or clamp_len < 0):
            raise ValueError(f"xl: clamp_len must be null or an integer >= 0, got {clamp_len!r}")
        self.clamp_len, self.share_uv = clamp_len, share_uv
        H, d_h = dims.n_head, dims.d_head
        self.w_kr = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model, bias=False) for _ in range(dims.n_layer))
        shape = (H, d_h) if share_uv else (dims.n_layer, H, d_h)
        self.u = nn.Parameter(torch.zeros(shape))  # global content bias
        self.v = nn.Parameter(torch.zeros(shape))  # global position bias

    def _uv(self, layer: int) -> tuple[Tensor, Tensor]:
        u, v = (self.u, self.v) if self.share_uv else (self.u[layer], self.v[layer])
        return u[None, :, None, :], v[None, :, None, :]  # [1, H, 1, d_h]

    def distances(self, pos: Positions) -> Tensor:
        """[N] distances of the last query to every key, N-1 .. 0, capped at clamp_len."""
        d = pos.q[-1] - pos.k
        return d if self.clamp_len is None else d.clamp(max=self.clamp_len)

    def position_scores(self, layer: int, q: Tensor, pos: Positions) -> Tensor:
        """(b)+(d) before the shift: [B, H, L, N], column c = (q_i + v) . W_{k,R} R_{N-1-c}."""
        H, d_h = self.dims.n_head, self.dims.d_head
        R = sinusoid_table(self.distances(pos), self.dims.d_model).to(q.dtype)  # [N, D]
        r = self.w_kr[layer](R).view(-1, H, d_h).transpose(0, 1)  # [H, N, d_h]: W_{k,R} R
        _, v = self._uv(layer)
        return (q + v.to(q.dtype)) @ r.transpose(-1, -2)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, pos: Positions, dropout_p: float) -> Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        u, _ = self._uv(layer)
        bias = relative_shift(self.position_scores(layer, q, pos)) * scale  # ((b)+(d)) / sqrt(d_h)
        bias = bias + mask_to_bias(pos.visible, bias.dtype)
        return F.scaled_dot_product_attention(q + u.to(q.dtype), k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)  # (a)+(c) + bias

    def extra_repr(self) -> str:
        return f"clamp_len={self.clamp_len}, share_uv={self.share_uv}"
