"""Transformer-XL relative encoding (Dai et al. 2019).

No input encoding. R_d = PE(d) for the distance d = i - j (fixed sinusoid), projected per layer by
W_{k,R}; learned u, v (per head) replace the query's absolute position:

    A_ij = (q_i + u) . k_j  +  (q_i + v) . (W_{k,R} R_{i-j}),   scaled by 1/sqrt(d_h)
           [(a) + (c)]          [(b) + (d)]

(b)+(d) is one GEMM per layer against the N = M + L distances (plus one future distance, masked),
[.., L, N+1], aligned by the relative shift (a strided view, no copy) and added to (a)+(c), a
second GEMM; then the mask, softmax and the values. The shift's backward is written by hand (one
padded copy of the gradient; autograd's would fill a zero tensor and copy into it). SDPA cannot
serve: its fused kernels give no gradient for an additive bias, and its math fallback costs more
than these few lines. No [L, N, D] tensor of R vectors is ever built.

``clamp_len``: distances past it use R_{clamp_len}; null means no clamp (the published code's
``clamp_len <= 0``). 0 is refused: the published code reads it as "no clamp", a plain reading as
"every distance is 0". With the model's ``pos_dropout``, R is dropped out once per segment and every
layer sees the same dropped R, as in the published code. With ``model.random_positions`` (positions with gaps)
(b)+(d) is computed for every distance up to the largest and each pair gathers its own, in place of the shift.
"""

import math

import torch
from torch import Tensor, nn

from . import fused
from .base import (
    AttentionInputs,
    Dims,
    ExplicitScores,
    PositionDropout,
    Positions,
    mask_to_bias,
    sinusoid_table,
)
from .registry import register


def relative_shift(x: Tensor, n_keys: int | None = None) -> Tensor:
    """Transformer-XL's relative shift, as a strided view (no copy).

    x: [.., L, W], column c holding distance N-1-c (N = ``n_keys``, default W; W >= N; columns past
    N-1 hold the negative distances -1, -2, .. of future keys). Returns [.., L, N] where (i, j) holds
    distance M + i - j, M = N - L: the paper's "pad one zero column, view as [N+1, L], drop the first
    row, view back". Row i reads column j + L-1-i, i.e. flat offset (L-1) + i (W-1) + j of the
    row-major [L, W] block (inside it since W >= N). Entries with j > M + i (future keys) are garbage
    and must be masked. With W = N + 1 no two entries share storage, which keeps the backward cheap.
    """
    *lead, L, W = x.shape
    N = W if n_keys is None else n_keys
    x = x.contiguous()
    if W > N:  # the same view by slice and view only: torch.compile's CPU backward crashed on the as_strided one
        return x.reshape(*lead, L * W)[..., L - 1 : L - 1 + L * (W - 1)].view(*lead, L, W - 1)[..., :N]
    return x.as_strided((*lead, L, N), (*x.stride()[:-2], W - 1, 1), x.storage_offset() + L - 1)


class _AddShifted(torch.autograd.Function):
    """scores + relative_shift(table): scores [.., L, N], table [.., L, N+1]. The gradient of the table
    is the scores' gradient laid back into [.., L, N+1]: the shift reads one contiguous run of the
    flattened block, from offset L-1, so padding L-1 zeros in front and one behind is all."""

    @staticmethod
    def forward(ctx, scores: Tensor, table: Tensor) -> Tensor:
        # out of place: as fast as in place (one read of each, one write), and torch.compile's
        # functionalization failed on the in-place version's aliased output
        return scores + relative_shift(table, scores.shape[-1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        *lead, L, N = grad.shape
        table = grad.new_empty(*lead, L * (N + 1))  # not F.pad: it zero-fills all of it before copying
        table[..., : L - 1] = 0
        table[..., L - 1 + L * N :] = 0
        table[..., L - 1 : L - 1 + L * N] = grad.reshape(*lead, L * N)
        return grad, table.view(*lead, L, N + 1)


@register
class XLRelative(ExplicitScores):
    name = "xl"
    kind = "relative"
    family = "relative (Transformer-XL)"
    positions_enter = "`(q+u).k + (q+v).W_R R_{i-j}`"
    with_memory = "designed for it"
    fused_from_keys = 1024  # H200 bf16: fused 0.90-0.91x the unfused step at 1024-2048 keys, 1.13-1.54x at 300-768

    def __init__(self, dims: Dims, *, clamp_len: int | None = None, share_uv: bool = True):
        super().__init__(dims)
        if clamp_len is not None and (isinstance(clamp_len, bool) or not isinstance(clamp_len, int) or clamp_len < 1):
            hint = " (the published code's clamp_len=0 means no clamp: write null)" if clamp_len == 0 else ""
            raise ValueError(f"xl: clamp_len must be null (no clamp) or an integer >= 1, got {clamp_len!r}{hint}")
        self.clamp_len, self.share_uv = clamp_len, share_uv
        self.pos_drop = PositionDropout()
        self._dropped_R: tuple[Positions, Tensor] | None = None  # (segment, its dropped R), while training
        H, d_h = dims.n_head, dims.d_head
        self.w_kr = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model, bias=False) for _ in range(dims.n_layer))
        shape = (H, d_h) if share_uv else (dims.n_layer, H, d_h)
        self.u = nn.Parameter(torch.zeros(shape))  # global content bias
        self.v = nn.Parameter(torch.zeros(shape))  # global position bias

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """W_{k,R} R_d for the N distances, 2 N D D, once per batch; (q + v) . r, terms (b) + (d): 2 L N D."""
        L, N, D = segment_len, segment_len + mem_len, self.dims.d_model
        return 2 * N * D * D / batch_size + 2 * L * N * D

    def _uv(self, layer: int) -> tuple[Tensor, Tensor]:
        u, v = (self.u, self.v) if self.share_uv else (self.u[layer], self.v[layer])
        return u[None, :, None, :], v[None, :, None, :]  # [1, H, 1, d_h]

    def distances(self, pos: Positions, future: int = 0) -> Tensor:
        """[D + 1 + future] the distances D .. 0 (``fused.distances``: the last query's to every key, D = N - 1,
        unless positions have gaps), then -1 .. -future for ``future`` keys past the segment (masked anyway),
        capped at clamp_len."""
        d = torch.cat([fused.distances(pos), -torch.arange(1, future + 1, device=pos.k.device)])
        return d if self.clamp_len is None else d.clamp(max=self.clamp_len)

    def position_vectors(self, layer: int, pos: Positions, dtype: torch.dtype, future: int = 0) -> Tensor:
        """[H, N + future, d_h]: W_{k,R} R_d per head, for the distances of ``distances``."""
        H, d_h = self.dims.n_head, self.dims.d_head
        if self.training and self.pos_drop.p > 0:  # one dropout mask per segment, shared by all layers
            if self._dropped_R is None or self._dropped_R[0] is not pos:
                self._dropped_R = (pos, self.pos_drop(sinusoid_table(self.distances(pos, 1), self.dims.d_model)))
            R = self._dropped_R[1][: pos.max_distance + 1 + future].to(dtype)
        else:
            R = sinusoid_table(self.distances(pos, future), self.dims.d_model).to(dtype)  # [N, D]
        return self.w_kr[layer](R).view(-1, H, d_h).transpose(0, 1)  # W_{k,R} R

    def position_scores(self, layer: int, q: Tensor, pos: Positions) -> Tensor:
        """(b)+(d) before the shift: [B, H, L, N], column c = (q_i + v) . W_{k,R} R_{N-1-c}."""
        _, v = self._uv(layer)
        return (q + v.to(q.dtype)) @ self.position_vectors(layer, pos, q.dtype).transpose(-1, -2)

    def scores(self, layer: int, q: Tensor, k: Tensor, pos: Positions, logit_scale: Tensor | None = None) -> Tensor:
        """[B, H, L, N] masked scores lambda_i A_ij / sqrt(d_h), -inf where key j is not visible to query i;
        logit_scale lambda: [H, L, 1] (SSMax) or None (1)."""
        B, H, L, d_h = q.shape
        N, scale = k.shape[2], 1.0 / math.sqrt(d_h)
        u, v = self._uv(layer)
        q = q.contiguous() * scale  # 1/sqrt(d_h) applied to [L, d_h] here, not to [L, N] later
        qu = q + u.to(q.dtype) * scale  # (q_i + u) / sqrt(d_h)
        qv = q + v.to(q.dtype) * scale  # (q_i + v) / sqrt(d_h)
        if logit_scale is not None:  # A_ij is linear in (q_i + u, q_i + v): lambda_i on them scales all four terms
            qu, qv = qu * logit_scale.to(q.dtype), qv * logit_scale.to(q.dtype)
        qu, qv = qu.reshape(B * H, L, d_h), qv.reshape(B * H, L, d_h)
        # (b)+(d) for the distances N-1 .. -1 (one future column keeps the shifted view free of overlap): [B*H, L, W]
        r = self.position_vectors(layer, pos, q.dtype, future=1)  # [H, W, d_h]
        W = r.shape[1]
        bd = torch.bmm(qv, r.transpose(1, 2).expand(B, H, d_h, W).reshape(B * H, d_h, W))
        # (a)+(c): [B*H, L, N]; then A_ij / sqrt(d_h) = (a)+(c) + shifted (b)+(d), where (i, j) holds distance
        # M + i - j. bmm and adds, not baddbmm: on the EPYC baddbmm took twice a bmm's time.
        ac = torch.bmm(qu, k.reshape(B * H, N, d_h).transpose(1, 2))
        if pos.consecutive:
            a = _AddShifted.apply(ac, bd)
        else:  # positions with gaps (model.random_positions): no shift lines (i, j) up, each pair reads its column
            D = pos.max_distance
            column = (D - pos.distance).clamp(max=D)  # distance q_i - k_j sits at column D - it; future keys: D
            a = ac + bd.gather(-1, column.expand(B * H, L, N))
        # the mask as an additive -inf: its backward is the identity (a masked_fill's costs a pass)
        return a.add_(mask_to_bias(pos.visible, q.dtype)).view(B, H, L, N)

    def attend(self, a: AttentionInputs) -> Tensor:
        # (b)+(d) needs a gradient, which SDPA's fused kernels do not give for an additive mask, so the
        # softmax attention is written out: softmax(A / sqrt(d_h)) v. The fused path (no sink): fused.py.
        q, logit_scale = a.q, a.softmax.scale
        if a.softmax.sink is None and fused.use_fused(self, q, a.k, a.dropout_p):
            u, vb = self._uv(a.layer)
            row = q.shape[-1] ** -0.5 if logit_scale is None else logit_scale.to(q.dtype) * q.shape[-1] ** -0.5
            bd = ((q + vb.to(q.dtype)) * row) @ self.position_vectors(a.layer, a.pos, q.dtype).transpose(-1, -2)
            q_u = q + u.to(q.dtype)
            q_u = q_u if logit_scale is None else q_u * logit_scale.to(q.dtype)
            return fused.attend_xl(q_u, a.k, a.v, a.pos, bd)
        return super().attend(a)

    def extra_repr(self) -> str:
        return f"clamp_len={self.clamp_len}, share_uv={self.share_uv}"
