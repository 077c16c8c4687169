"""Shaw et al. (2018): relative position representations with clipping.

No input encoding. Per layer, learned tables a^K, a^V of 2K+1 rows (size d_h, shared by heads),
indexed by clip(j - i, -K, K):

    e_ij = q_i . (k_j + a^K_{clip(j-i)}) / sqrt(d_h)
    z_i  = sum_j softmax(e)_ij (v_j + a^V_{clip(j-i)})

Every distance past K collapses onto one row, memory included, and nothing per pair is built. Both
terms are written as "the far row for every key, a correction on the K nearest distances", the
diagonals of the [L, N] block, since a causal decoder only sees j - i <= 0:

    e_ij = q_i . (k_j + a^K_0) / sqrt(d_h)  +  [0 <= i - j < K] q_i . (a^K_{K-(i-j)} - a^K_0) / sqrt(d_h)
    z_i  = sum_j p_ij v_j + a^V_0  +  sum_{d < K} p_{i,i-d} (a^V_{K-d} - a^V_0)

(row 0 of the tables is clip(j - i) = -K, the far row). The scores are one GEMM, as for plain
attention (k + a^K_0 is a [N, d_h] add), plus K diagonals of [L] entries; the values one GEMM plus the
K diagonals of the probabilities (a strided view) times [K, d_h]. With ``model.random_positions`` (positions
with gaps) the near distances are no diagonals: each pair gathers its row's score term, and the values sum
the probabilities per row (a scatter), then times a^V.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import fused
from .base import AttentionInputs, Dims, PositionalScheme, Positions, mask_to_bias
from .registry import register


def near_diagonals(x: Tensor, n: int) -> tuple[Tensor, Tensor, int]:
    """x: [.., L, N] (keys j = -M..L-1 as columns 0..N-1), n <= N.

    Returns (near, flat, pad): near [.., L, n] is a strided view of ``flat``, column t = x at distance
    n-1-t (key M + i - (n-1-t)); ``flat`` is x as [.., L*N], padded in front by ``pad`` zeros (a copy)
    where M < n - 1. Each column of near is a diagonal of the [L, N] block: flat offset
    (M - n + 1) + i (N + 1) + t. Reads before a row's first key land on the previous row's future keys
    (probability 0) or on the padding.
    """
    *lead, L, N = x.shape
    start = N - L - n + 1
    flat = x.reshape(*lead, L * N)
    pad = max(0, -start)
    if pad:
        flat = F.pad(flat, (pad, 0))
    near = flat.as_strided((*lead, L, n), (*flat.stride()[:-1], N + 1, 1), flat.storage_offset() + start + pad)
    return near, flat, pad


def near_views(x: Tensor, n: int) -> list[tuple[Tensor, tuple]]:
    """The n nearest diagonals of x [.., L, N] (contiguous) as views into x itself (no copy), each with the index
    of a [.., L, n] tensor in ``near_diagonals``' layout (column t: distance n-1-t) that it lines up with. Rows
    first..L-2 are one [rows, N+1] window of the flattened block, its first n columns; the last row is its n last
    keys; where M < n - 1, row 0's diagonals would start before the block and it gets a view of its keys 0..M
    (first = 1). Slices and views only: torch.compile crashed on this CPU on an ``unfold`` variant. As in
    ``near_diagonals``, the pairs (i, t) without a key (n-1-t > M + i) fall on the previous row's future keys."""
    *lead, L, N = x.shape
    start = N - L - n + 1  # flat offset of row 0's farthest near key (distance n-1)
    first = 1 if start < 0 else 0
    flat = x.view(*lead, L * N)
    views = [(x[..., L - 1, N - n :], (..., L - 1, slice(None)))]
    rows = L - 1 - first
    if rows > 0:
        s = start + first * (N + 1)
        window = flat[..., s : s + rows * (N + 1)].view(*lead, rows, N + 1)[..., :n]
        views.append((window, (..., slice(first, L - 1), slice(None))))
    if first:
        views.append((x[..., 0, : n + start], (..., 0, slice(-start, None))))
    return views


def has_key(L: int, N: int, n: int, device) -> Tensor:
    """[L, n] bool: query i has a key at distance n-1-t (t the column), i.e. n-1-t <= M + i."""
    return (n - 1 - torch.arange(n, device=device)) <= (N - L + torch.arange(L, device=device))[:, None]


class _AddNearScores(torch.autograd.Function):
    """e + near on its n nearest diagonals + mask, in place: e [.., L, N] (keys j = -M..L-1, contiguous), near
    [.., L, n] in ``near_diagonals``' layout (column t: distance n-1-t), mask [L, N] (0 / -inf). The diagonals are
    added through a few views (a loop over them would launch 2n kernels a layer on a GPU; autograd's in-place add
    on a view would copy the whole gradient). The pairs where a query has no key at that distance land on the
    previous row's future keys, masked here too; their gradient is zeroed. The mask's gradient is the identity
    (a masked_fill's would cost a pass)."""

    @staticmethod
    def forward(ctx, e: Tensor, near: Tensor, mask: Tensor) -> Tensor:
        ctx.n = near.shape[-1]
        for view, index in near_views(e, near.shape[-1]):
            view.add_(near[index])
        ctx.mark_dirty(e)
        return e.add_(mask)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad_near = grad.new_empty(*grad.shape[:-1], ctx.n)
        for view, index in near_views(grad.contiguous(), ctx.n):
            grad_near[index] = view
        return grad, grad_near.masked_fill_(~has_key(grad.shape[-2], grad.shape[-1], ctx.n, grad.device), 0), None


class _NearValues(torch.autograd.Function):
    """probs @ v + near(probs) @ c, c [n, d_h]. The backward adds the near term's gradient into the n
    diagonals of (dz v^T) in place; autograd alone would build a [.., L, N] tensor of zeros for it."""

    @staticmethod
    def forward(ctx, probs: Tensor, v: Tensor, c: Tensor) -> Tensor:
        ctx.save_for_backward(probs, v, c)
        return probs @ v + near_diagonals(probs, c.shape[0])[0] @ c

    @staticmethod
    def backward(ctx, grad: Tensor):
        probs, v, c = ctx.saved_tensors
        n, d_h = c.shape
        grad_probs = grad_v = grad_c = None
        if ctx.needs_input_grad[0]:
            grad_probs = grad @ v.transpose(-1, -2)
            near, flat, pad = near_diagonals(grad_probs, n)
            near.add_(grad @ c.T)
            if pad:
                grad_probs = flat[..., pad:].view(grad_probs.shape)
        if ctx.needs_input_grad[1]:
            grad_v = probs.transpose(-1, -2) @ grad
        if ctx.needs_input_grad[2]:
            grad_c = (near_diagonals(probs, n)[0].transpose(-1, -2) @ grad).reshape(-1, n, d_h).sum(0)
        return grad_probs, grad_v, grad_c


@register
class Shaw(PositionalScheme):
    name = "shaw"
    kind = "relative"
    family = "relative, clipped"
    positions_enter = "learned `a^K`, `a^V` by `clip(i - j, K)`"
    with_memory = "distances past `K` share one row"

    def __init__(self, dims: Dims, *, K: int = 16):
        super().__init__(dims)
        if not isinstance(K, int) or isinstance(K, bool) or K < 1:
            raise ValueError(f"shaw: the clipping distance K must be an integer >= 1, got {K!r}")
        self.K = K
        rows = 2 * K + 1
        self.a_key = nn.Parameter(torch.randn(dims.n_layer, rows, dims.d_head) * 0.02)  # a^K per layer
        self.a_value = nn.Parameter(torch.randn(dims.n_layer, rows, dims.d_head) * 0.02)  # a^V per layer

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """q a^K^T and P a^V over the 2K+1 rows (the model's math, not the near-diagonal kernel): 2 x 2 L D (2K+1)."""
        return 2 * 2 * segment_len * self.dims.d_model * (2 * self.K + 1)

    def buckets(self, pos: Positions) -> Tensor:
        """[L, N] row index clip(j - i, -K, K) + K."""
        return (-pos.distance).clamp(-self.K, self.K) + self.K

    def scores(self, layer: int, q: Tensor, k: Tensor, pos: Positions) -> Tensor:
        """[B, H, L, N] masked scores e_ij, -inf where key j is not visible to query i."""
        N, K, scale = k.shape[2], self.K, q.shape[-1] ** -0.5
        n = min(K, N)
        a_key = self.a_key[layer].to(q.dtype)
        q = q * scale  # 1/sqrt(d_h) applied to [L, d_h], not to [L, N]
        # gaps (model.random_positions), or compiling (torch.compile traces neither the in-place autograd functions
        # below nor their as_strided views): each pair gathers q_i . (a^K_b - a^K_0), b its row
        if not pos.consecutive or torch.compiler.is_compiling():
            rows = (q @ (a_key - a_key[0]).T).gather(-1, self.buckets(pos).expand(*q.shape[:-1], N))
            return q @ (k + a_key[0]).transpose(-1, -2) + rows + mask_to_bias(pos.visible, q.dtype)
        # distance d < K reads a^K_{K-d} instead of the far row: q_i . (a^K_{K-d} - a^K_0) / sqrt(d_h) onto
        # diagonal d; near column t: distance n-1-t, row K-n+1+t (as for the values below)
        near = q @ (a_key[K + 1 - n : K + 1] - a_key[0]).T  # [B, H, L, n]
        # far row for every key, q_i . (k_j + a^K_0) / sqrt(d_h), one GEMM, plus the near diagonals and the mask
        e = q @ (k + a_key[0]).transpose(-1, -2)
        return _AddNearScores.apply(e, near, mask_to_bias(pos.visible, q.dtype))

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        q, softmax = a.q, a.softmax
        if softmax.scale is not None:  # e_ij is linear in q_i: lambda_i e_ij = (lambda_i q_i) . (k_j + a^K)
            q = q * softmax.scale.to(q.dtype)
        return softmax.probs(self.scores(a.layer, q, a.k, a.pos))

    def attend(self, a: AttentionInputs) -> Tensor:
        layer, q, k, v, pos, softmax = a.layer, a.q, a.k, a.v, a.pos, a.softmax
        if softmax.scale is not None:  # SSMax: e_ij is linear in q_i, so lambda_i q_i scales it on both paths
            q = q * softmax.scale.to(q.dtype)
        if softmax.sink is None and fused.use_fused(self, q, k, a.dropout_p, needs_lse=True):
            # qa column d: q_i . a^K_{K-d} / sqrt(d_h)
            rows = self.a_key[layer].to(q.dtype)[self.K - torch.arange(self.K + 1, device=q.device)]
            qa = (q * q.shape[-1] ** -0.5) @ rows.T
            return fused.attend_shaw(q, k, v, pos, qa, self.a_value[layer])
        probs = self.attention_probs(a.but(q=q, softmax=softmax.unscaled()))  # softmax(e), a sink's share out
        if a.dropout_p > 0:
            probs = F.dropout(probs, a.dropout_p)
        K, n = self.K, min(self.K, k.shape[2])  # near column t: distance n-1-t, row K-n+1+t
        # CUDA autocast keeps the softmax in fp32; the product with v runs in v's dtype anyway, and the
        # hand-written backward needs all three in one dtype
        probs, a_value = probs.to(v.dtype), self.a_value[layer].to(v.dtype)
        if (
            not pos.consecutive or torch.compiler.is_compiling()
        ):  # (as in scores) sum the probabilities per row b, then z_i = sum_j p_ij v_j + sum_b P_ib a^V_b
            per_row = probs.new_zeros(*probs.shape[:-1], 2 * K + 1)
            return probs @ v + per_row.scatter_add_(-1, self.buckets(pos).expand_as(probs), probs) @ a_value
        # z_i = sum_j p_ij v_j + sum_b P_ib a^V_b, with the bucket sums P_ib written as
        #     sum_b P_ib a^V_b = (sum_j p_ij) a^V_0 + sum_{d < n} p_{i, i-d} (a^V_{K-d} - a^V_0):
        # every key gets the far row a^V_0, the n nearest distances are corrected (diagonals of p).
        out = _NearValues.apply(probs, v, a_value[K + 1 - n : K + 1] - a_value[0])
        exact = a.dropout_p == 0 and softmax.sink is None  # rows sum to 1 (a sink or dropout leaves less)
        row_sum = 1.0 if exact else probs.sum(-1, keepdim=True)
        return out + row_sum * a_value[0]

    def extra_repr(self) -> str:
        return f"K={self.K}"
