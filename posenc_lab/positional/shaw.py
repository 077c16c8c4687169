"""Shaw et al. (2018): relative position representations with clipping.

No input encoding. Per layer, learned tables a^K, a^V of 2K+1 rows (size d_h, shared by heads),
indexed by clip(j - i, -K, K):

    e_ij = q_i . (k_j + a^K_{clip(j-i)}) / sqrt(d_h)
    z_i  = sum_j softmax(e)_ij (v_j + a^V_{clip(j-i)})

Every distance past K collapses onto one row, memory included. Nothing per pair is built:
q @ a^K^T is [.., L, 2K+1], gathered by bucket; for values the probabilities are summed per
bucket ([.., L, 2K+1]) and multiplied by a^V.
"""

import math

import torch
from torch import Tensor, nn

from .base import Dims, Positions, PositionalScheme
from .registry import register


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

    def attention_probs(self, layer: int, q: Tensor, k: Tensor, pos: Positions) -> Tensor:
        B, H, L, _ = q.shape
        index = self.buckets(pos).expand(B, H, L, k.shape[2])
        scores = q @ k.transpose(-1, -2)  # q_i . k_j
        scores = scores + torch.gather(q @ self.a_key[layer].to(q.dtype).T, -1, index)  # + q_i . a^K_{clip(j-i)}
        scores = (scores / math.sqrt(q.shape[-1])).masked_fill(~pos.visible, float("-inf"))
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, pos: Positions, dropout_p: float) -> Tensor:
        B, H, L, _ = q.shape
        index = self.buckets(pos).expand(B, H, L, k.shape[2])
        a_value = self.a_value[layer].to(q.dtype)
        probs = self.attention_probs(layer, q, k, pos)  # softmax(e)
        if dropout_p > 0:
            probs = torch.nn.functional.dropout(probs, dropout_p)

        per_bucket = torch.zeros(B, H, L, a_value.shape[0], dtype=probs.dtype, device=probs.device)
        per_bucket.scatter_add_(-1, index, probs)  # sum_j of softmax(e)_ij within each bucket
        return probs @ v + per_bucket @ a_value  # sum_j p_ij v_j + sum_b P_ib a^V_b

    def extra_repr(self) -> str:
        return f"K={self.K}"
