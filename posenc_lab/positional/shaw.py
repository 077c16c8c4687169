"""Shaw et al. (2018): relative position representations with clipping.

No input encoding. Per layer, learned tables a^K, a^V of 2K+1 rows (size d_h, shared by heads),
indexed by clip(j - i, -K, K):

    e_ij = q_i . (k_j + a^K_{clip(j-i)}) / sqrt(d_h)
    z_i  = sum_j softmax(e)_ij (v_j + a^V_{clip(j-i)})

Every distance past K collapses onto one row, memory included. Nothing per pair is built:
q . a^K_r for the K+1 rows of j - i <= 0 (all a causal decoder uses), gathered by bucket per
distance (as q @ a^K[rows]^T, [.., L, N+1]) and aligned with Transformer-XL's relative shift; for values the probabilities are
summed per bucket ([.., L, K+1]: the K nearest distances are diagonals of the probabilities, a
strided view; the far bucket is the rest of the row) and multiplied by a^V.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, Positions, PositionalScheme, relative_shift, unshifted_mask
from .registry import register


def bucket_sums(probs: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """probs: [.., L, N] (keys j = -M..L-1 as columns 0..N-1), n <= N.

    Returns near [.., L, n], column t = the probability at distance n-1-t (key M + i - (n-1-t)), 0
    where that key does not exist; and far [.., L] = the rest of the row (distances >= n).
    The near entries are diagonals of each [L, N] block: a strided view, flat offset
    (M - n + 1) + i (N + 1) + t. Where that would start before the block (M < n - 1) the block is
    padded in front; reads that fall before a row's first key land on the previous row's future keys,
    whose probability is 0, or on the padding.
    """
    *lead, L, N = probs.shape
    start = N - L - n + 1
    flat = probs.reshape(*lead, L * N)
    if start < 0:
        flat, start = F.pad(flat, (-start, 0)), 0
    near = flat.as_strided((*lead, L, n), (*flat.stride()[:-1], N + 1, 1), flat.storage_offset() + start)
    return near, probs.sum(-1) - near.sum(-1)


@register
class Shaw(PositionalScheme):
    name = "shaw"

    def __init__(self, dims: Dims, *, K: int = 16):
        super().__init__(dims)
        if not isinstance(K, int) or isinstance(K, bool) or K < 1:
            raise ValueError(f"shaw: the clipping distance K must be an integer >= 1, got {K!r}")
        self.K = K
        rows = 2 * K + 1
        self.a_key = nn.Parameter(torch.randn(dims.n_layer, rows, dims.d_head) * 0.02)  # a^K per layer
        self.a_value = nn.Parameter(torch.randn(dims.n_layer, rows, dims.d_head) * 0.02)  # a^V per layer

    def buckets(self, pos: Positions) -> Tensor:
        """[L, N] row index clip(j - i, -K, K) + K."""
        return (-pos.distance).clamp(-self.K, self.K) + self.K

    def scores(self, layer: int, q: Tensor, k: Tensor, pos: Positions) -> Tensor:
        """[B, H, L, N] masked scores e_ij, -inf where key j is not visible to query i."""
        B, H, L, d_h = q.shape
        N, W, K, scale = k.shape[2], k.shape[2] + 1, self.K, 1.0 / math.sqrt(d_h)
        # q_i . a^K_r gathered by bucket per distance d = N-1 .. -1 (column c: d = N-1-c; the one future
        # column keeps the shift free of overlap): row r = K - min(d, K). Gathering the K+1 used rows of
        # the table before the product, (q a^K^T)[.., rows] = q (a^K[rows])^T, makes it one GEMM (and its
        # backward two), with the mask, laid out before the shift, accumulated into it: [B*H, L, W].
        d = (N - 1 - torch.arange(W, device=q.device)).clamp(0, K)
        a_key = self.a_key[layer].to(q.dtype)[K - d]  # [W, d_h]
        q = q.contiguous().view(B * H, L, d_h) * scale  # 1/sqrt(d_h) applied to [L, d_h], not to [L, N]
        qa = torch.baddbmm(unshifted_mask(pos.visible, W, q.dtype), q, a_key.T.expand(B * H, d_h, W))
        # e_ij = (q_i . k_j + q_i . a^K_{clip(j-i)}) / sqrt(d_h), one GEMM accumulating onto the shifted q . a^K
        e = torch.baddbmm(relative_shift(qa, N), q, k.reshape(B * H, N, d_h).transpose(1, 2))
        return e.view(B, H, L, N)

    def attention_probs(self, layer: int, q: Tensor, k: Tensor, pos: Positions) -> Tensor:
        return torch.softmax(self.scores(layer, q, k, pos), dim=-1, dtype=torch.float32).to(q.dtype)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, pos: Positions, dropout_p: float) -> Tensor:
        probs = self.attention_probs(layer, q, k, pos)  # softmax(e)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p)
        near, far = bucket_sums(probs, min(self.K, k.shape[2]))
        a_value = self.a_value[layer].to(probs.dtype)
        # sum_j p_ij v_j  +  sum_b P_ib a^V_b: the far bucket (row 0) and the near ones (rows K-n+1 .. K)
        out = probs @ v + near @ a_value[self.K + 1 - near.shape[-1] : self.K + 1]
        return out + far[..., None] * a_value[0]

    def extra_repr(self) -> str:
        return f"K={self.K}"
