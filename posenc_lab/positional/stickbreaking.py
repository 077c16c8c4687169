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
the [B, H, L, N] logs, with no flip of them, and from the scores to the output is one autograd function with its
backward written out (``_BrokenStick``).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import AttentionInputs, Dims, PositionalScheme, Positions
from .registry import register

#: exp's argument is clamped here: exp(-87) = 1.6e-38, the smallest normal float, so a weight changes by less than
#: that; on the x86 CPU measured, exp of a more negative number (an underflow) took 7x as long (docs/PERFORMANCE.md)
LOG_FLOOR = -87.0


class _BrokenStick(torch.autograd.Function):
    """q [B, H, L, d_h] (scaled), k, v [B, H, N, d_h] (keys reversed: nearest first), b [H, d_h], takes [L, N] bool
    (reversed) -> z_i = sum_j A_ij v_j + r_i b_h, fp32 inside. Forward: log A = z + cumsum(log(1 - beta)) (the
    inclusive sum holds log(1 - beta_ij) = log beta_ij - z_ij, so z + it = log beta_ij + the nearer keys' sum) and
    r_i = exp(the row's total). Backward, with a = A (dz_i . v_j) and P = cumsum(a) (the nearer keys' and its own):
    d/dz_ij = a_ij - beta_ij (a_ij + c_i - P_ij), c_i = sum_j a_ij + r_i (dz_i . b_h). Autograd's own keeps about
    twice the [B, H, L, N] tensors and passes over them."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, b: Tensor, takes: Tensor) -> Tensor:
        # fp32 inside, under autocast too: the saved tensors must be what backward multiplies (fp32)
        with torch.autocast(q.device.type, enabled=False):
            return _BrokenStick._forward(ctx, q, k, v, b, takes)

    @staticmethod
    def _forward(ctx, q: Tensor, k: Tensor, v: Tensor, b: Tensor, takes: Tensor) -> Tensor:
        dtypes = (q.dtype, k.dtype, v.dtype, b.dtype)
        q, k, v, b = q.float(), k.float(), v.float(), b.float()
        takes = takes.float()  # masks as products: a multiply is a cheaper pass than a select
        z = q @ k.transpose(-1, -2)  # z_ij
        # log(1 - beta) = -softplus(z), 0 where the key takes no share; summed over the keys up to j
        cum = F.softplus(z).mul_(-takes).cumsum_(-1)
        left = cum[..., -1].exp()  # r_i
        weights = cum.add_(z).clamp_(min=LOG_FLOOR).exp_().mul_(takes)  # A_ij
        ctx.save_for_backward(q, k, v, b, takes, z, weights, left)
        ctx.dtypes = dtypes
        return (weights @ v).addcmul_(left[..., None], b[None, :, None]).to(dtypes[2])

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, b, takes, z, weights, left = ctx.saved_tensors
        grad = grad.float()
        a = (grad @ v.transpose(-1, -2)).mul_(weights)  # a_ij = A_ij (dz_i . v_j)
        c = a.sum(-1) + left * (grad * b[None, :, None]).sum(-1)  # c_i
        tmp = a.cumsum(-1).neg_().add_(c[..., None]).add_(a)  # a_ij + c_i - P_ij
        grad_z = a.sub_(tmp.mul_(torch.sigmoid(z).mul_(takes)))
        grad_q, grad_k = grad_z @ k, grad_z.transpose(-1, -2) @ q
        grad_v = weights.transpose(-1, -2) @ grad
        grad_b = (left[..., None] * grad).sum((0, 2))
        return (*(g.to(t) for g, t in zip((grad_q, grad_k, grad_v, grad_b), ctx.dtypes)), None)


@register
class StickBreaking(PositionalScheme):
    name = "stickbreaking"
    kind = "relative"
    family = "data-dependent, no softmax"
    positions_enter = "`A_ij = beta_ij prod (1 - beta_it)` over the nearer keys, `beta = sigmoid(q.k)`"
    with_memory = "the stick runs back through the memory"
    random_positions_refused = "it reads no position: the order of the keys alone decides which breaks the stick first"
    softmax_refused = (
        "its attention is no softmax: each key takes sigmoid(z) of the stick the nearer keys left, and the stick left "
        "over goes to no key, so there is no normalisation over n keys to rescale"
    )
    not_translation_invariant = (
        "a pair's weight is its share of the stick the keys between its two tokens leave: it depends on what lies "
        "between them, not on i - j alone"
    )

    def __init__(self, dims: Dims, *, attend_current: bool = False):
        super().__init__(dims)
        self.attend_current = attend_current
        self.remainder = nn.Parameter(torch.zeros(dims.n_layer, dims.n_head, dims.d_head))  # b_h per layer

    def takes(self, pos: Positions) -> Tensor:
        """[L, N] bool, keys reversed (column c: key N-1-c): the keys that take a share of query i's stick."""
        takes = pos.visible if self.attend_current else pos.visible & (pos.k[None, :] != pos.q[:, None])
        return takes.flip(-1)

    def breaks(self, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> (A [B, H, L, N] with the keys in reversed order, column c = key
        N-1-c; r [B, H, L]), fp32: A_ij and the stick left over, by autograd (analysis, attention dropout)."""
        takes = self.takes(pos)
        z = ((q * q.shape[-1] ** -0.5) @ k.flip(2).transpose(-1, -2)).float()  # z_ij
        log_beta = F.logsigmoid(z)
        log_keep = (log_beta - z).masked_fill(~takes, 0.0)  # log(1 - beta) = logsigmoid(-z); 0: leaves the stick
        nearer = log_keep.cumsum(-1) - log_keep  # sum over the keys nearer than j
        weights = (log_beta + nearer).clamp(min=LOG_FLOOR).exp().masked_fill(~takes, 0.0)
        return weights, log_keep.sum(-1).exp()

    # a.softmax is always PLAIN here: ModelConfig refuses SSMax and a sink for this scheme (softmax_refused)
    def attention_probs(self, a: AttentionInputs) -> Tensor:
        """[B, H, L, N] the weights A_ij (each row sums to 1 - r_i: the stick left over is on no key)."""
        return self.breaks(a.q, a.k, a.pos)[0].flip(-1).to(a.q.dtype)

    def attend(self, a: AttentionInputs) -> Tensor:
        q, k, v, remainder = a.q, a.k, a.v, self.remainder[a.layer]
        if a.dropout_p == 0:
            q = q * q.shape[-1] ** -0.5
            return _BrokenStick.apply(q, k.flip(2), v.flip(2), remainder, self.takes(a.pos))
        weights, left = self.breaks(q, k, a.pos)
        out = F.dropout(weights, a.dropout_p).to(v.dtype) @ v.flip(2)  # sum_j A_ij v_j, A dropped out
        return out + left[..., None].to(v.dtype) * remainder[None, :, None].to(v.dtype)  # + r_i b_h

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"
