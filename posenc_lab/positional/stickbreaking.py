"""Stick-breaking attention (Tan et al., ICLR 2025): no softmax and no position index; the nearest keys break the
stick first.

Each visible key j breaks off the fraction beta_ij of what the keys nearer to query i left over:

    z_ij      = q_i . k_j / sqrt(d_h)
    beta_ij   = sigmoid(z_ij)
    A_ij      = beta_ij prod_{j < t, t visible} (1 - beta_it)        in log space:
    log A_ij  = logsigmoid(z_ij) + sum_{j < t, t visible} logsigmoid(-z_ij)
    r_i       = prod_{t visible} (1 - beta_it) = 1 - sum_j A_ij       the stick left over
    z_i       = sum_j A_ij v_j + r_i b_h                              b_h learned per layer and head

The order of the keys alone orders the attention: a key is reached only through the stick the keys between it
and the query leave, so this is a data-dependent decay with no distance in it.

Choices the paper leaves open, from the authors' code: a query does not attend to its own key
(``attend_current: false``, the default of their kernels and of their decoding, which drops the current key);
the leftover stick r_i goes to a learned per-head vector b_h, zero at the start (their model's ``head_bias``;
flash-linear-attention's layer drops it, which is b_h = 0 for ever); the logs in fp32. Their model also
normalises each head's output (a GroupNorm before the output projection): that is architecture, not position,
and is not done here.

With memory the stick runs back through the memory: every visible key, memory included, takes its share in
order of nearness, so a segment with memory weighs exactly as the same tokens at the end of one long run; the
same-length window and episode resets only change which keys are visible. The weights need every score of a row
before any of them (the stick is a product over the nearer keys), as CoPE's gates do: no flash kernel of this
project serves it (the authors ship a Triton kernel only), so the attention is written out. The keys are taken
in reversed order (a flip of k and v, [B, H, N, d_h]), so that the sum over the nearer keys is a plain cumsum of
the [B, H, L, N] logs, with no flip of them.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, PositionalScheme, Positions
from .registry import register


@register
class StickBreaking(PositionalScheme):
    name = "stickbreaking"
    kind = "relative"
    random_positions_refused = "it reads no position: the order of the keys alone decides which breaks the stick first"
    not_translation_invariant = (
        "a pair's weight is its share of the stick the keys between its two tokens leave: it depends on what lies "
        "between them, not on i - j alone"
    )

    def __init__(self, dims: Dims, *, attend_current: bool = False):
        super().__init__(dims)
        self.attend_current = attend_current
        self.remainder = nn.Parameter(torch.zeros(dims.n_layer, dims.n_head, dims.d_head))  # b_h per layer

    def breaks(self, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> (A [B, H, L, N] with the keys in reversed order, column c = key
        N-1-c; r [B, H, L]), fp32: A_ij and the stick left over."""
        L, N = pos.visible.shape
        takes = pos.visible if self.attend_current else pos.visible & (pos.k[None, :] != pos.q[:, None])
        takes = takes.flip(-1)  # [L, N], reversed: the nearest keys first
        z = ((q * q.shape[-1] ** -0.5) @ k.flip(2).transpose(-1, -2)).float()  # z_ij
        log_beta = F.logsigmoid(z)
        log_keep = (log_beta - z).masked_fill(~takes, 0.0)  # log(1 - beta) = logsigmoid(-z); 0: leaves the stick
        nearer = log_keep.cumsum(-1) - log_keep  # sum over the keys nearer than j
        weights = (log_beta + nearer).exp().masked_fill(~takes, 0.0)
        return weights, log_keep.sum(-1).exp()

    def attention_probs(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> Tensor:
        """[B, H, L, N] the weights A_ij (each row sums to 1 - r_i: the stick left over is on no key)."""
        return self.breaks(q, k, pos)[0].flip(-1).to(q.dtype)

    def attend(
        self,
        layer: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pos: Positions,
        dropout_p: float,
        context: Tensor | None = None,
    ) -> Tensor:
        weights, left = self.breaks(q, k, pos)
        if dropout_p > 0:
            weights = F.dropout(weights, dropout_p)
        out = weights.to(v.dtype) @ v.flip(2)  # sum_j A_ij v_j
        return out + left[..., None].to(v.dtype) * self.remainder[layer][None, :, None].to(v.dtype)  # + r_i b_h

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"
