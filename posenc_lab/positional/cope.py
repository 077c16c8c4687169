"""CoPE (Golovneva et al. 2024): contextual positions, counted by gates over the keys, not by token index.

Each query counts the keys between a key and itself, each weighted by a gate in (0, 1), and reads a learned
position embedding e[p] (per layer, d_h wide, shared by the heads) at that fractional count:

    g_it  = sigmoid(q_i . k_t / sqrt(d_h))                        0 for a key t that i cannot see
    p_ij  = sum_{t = j..i} g_it                                    a count in [0, keys seen]
    e[p]  = (1 - w) e[floor p] + w e[floor p + 1],  w = p - floor p
    scores_ij = q_i . k_j / sqrt(d_h) + q_i . e[p_ij]

The embedding is interpolated in the scores, not in d_h: z_i[n] = q_i . e[n] for the integers n = 0..P (one
[L, P+1] product), then q_i . e[p_ij] = z_i[floor p] + w (z_i[floor p + 1] - z_i[floor p]). From the gates to
the scores is one autograd function with its backward written out (``_CountedScores``): autograd's own took
a quarter more time at base sizes, flipping and zero-filling [B, H, L, N] tensors for the reverse cumsum and
the two gathers.

With memory the gates run over every visible key, memory included, so p counts back through the memory;
the same-length mask and episode resets only change which keys are visible. CoPE reads no position index,
so moving a stretch of content along the stream moves its counts with it, but a pair's position depends on
what lies between its two tokens, not on i - j alone. The gates need every score of the row before the
softmax, so no flash (fused) kernel can serve it: the attention is written out.

The maximum position P (``max_position``, the last row of e): a count is at most the number of keys a
query sees, M + L, so null sizes P to the run's M + L and nothing is clipped in training. Past P (a longer
memory at evaluation) ``overflow=clamp`` reads e[P] for every larger count, as the authors' code does;
``overflow=error`` refuses lengths whose counts could pass P, before any compute. Choices the paper leaves
open, from the authors' code: the gates use the scaled scores, the position term q . e is not scaled, e
starts at zero (CoPE starts as no encoding at all).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, ExplicitScores, Positions, mask_to_bias
from .registry import register

OVERFLOWS = ("clamp", "error")
FAR = -1e4  # the gates' mask under SSMax: finite, and sigmoid(FAR + any score) = 0 in fp32


class _CountedScores(torch.autograd.Function):
    """content [B, H, L, N] (scaled q.k, -inf where not visible), z [B, H, L, P+1] -> scores [B, H, L, N]:
    content + z interpolated at the count p = sum_{t >= j} sigmoid(content_t), clamped at P. fp32 inside."""

    @staticmethod
    def forward(ctx, content: Tensor, z: Tensor) -> Tensor:
        dtypes, content, P = (content.dtype, z.dtype), content.float(), z.shape[-1] - 1
        gates = torch.sigmoid(content)  # g_it, 0 where t is not visible
        count = gates.flip(-1).cumsum(-1).flip(-1)  # p_ij = sum over t >= j (t > i: not visible)
        if P < count.shape[-1]:  # a count may pass P (at most N keys are counted)
            count.clamp_(max=P)
        index = count.long()  # floor p (p >= 0)
        w = count.sub_(index)  # p - floor p
        # z_i[n + 1] - z_i[n]; 0 at n = P, where w = 0 (no out= into a slice: torch.compile cannot trace one)
        slope = F.pad((z[..., 1:] - z[..., :-1]).float(), (0, 1))
        slope_at = slope.gather(-1, index)
        scores = z.float().gather(-1, index).add_(content).addcmul_(w, slope_at)
        ctx.save_for_backward(gates, index, w, slope_at)
        ctx.dtypes, ctx.rows = dtypes, P + 1
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        gates, index, w, slope_at = ctx.saved_tensors
        grad = grad.float()
        # the count: dL/dp_ij = dL/ds_ij times the slope (0 past P: clamped counts sit at index P);
        # dL/dg_it = sum over j <= t of dL/dp_ij, a forward cumsum; then through the sigmoid, plus the direct term
        grad_gates = (grad * slope_at).cumsum_(-1)
        grad_content = torch.ops.aten.sigmoid_backward(grad_gates, gates).add_(grad)
        # z: (1 - w) of the gradient to floor p, w to floor p + 1
        high = grad * w
        grad_z = grad.new_zeros(*grad.shape[:-1], ctx.rows + 1)  # one column past P: floor p + 1 of p = P
        grad_z[..., :-1].scatter_add_(-1, index, grad - high)
        grad_z[..., 1:].scatter_add_(-1, index, high)
        return grad_content.to(ctx.dtypes[0]), grad_z[..., :-1].to(ctx.dtypes[1])


@register
class CoPE(ExplicitScores):
    name = "cope"
    kind = "relative"
    family = "contextual"
    positions_enter = "positions counted by gates `sigmoid(q.k)`, embedding interpolated"
    with_memory = "counts over memory too"
    random_positions_refused = "its positions are counted from the content (sums of gates): it reads no position"
    not_translation_invariant = (
        "a pair's position is the sum of the gates of the keys between its tokens: it depends on what lies "
        "between them, not on i - j alone"
    )

    def __init__(self, dims: Dims, *, max_position: int | None = None, overflow: str = "clamp"):
        super().__init__(dims)
        if max_position is None:
            raise ValueError(
                "cope: max_position=None must be sized to the run before the table is built "
                "(posenc_lab.positional.sized_options, as training does), or set an integer"
            )
        if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
            raise ValueError(f"cope: max_position must be an integer >= 1, got {max_position!r}")
        if overflow not in OVERFLOWS:
            raise ValueError(f"cope: overflow must be one of {', '.join(OVERFLOWS)}, got {overflow!r}")
        self.max_position, self.overflow = max_position, overflow
        self.embedding = nn.Parameter(torch.zeros(dims.n_layer, max_position + 1, dims.d_head))  # e[0..P] per layer

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """max_position=None -> segment_len + mem_len, the most keys a query can count."""
        if options.get("max_position") is None:
            return {**options, "max_position": segment_len + mem_len}
        return dict(options)

    def validate(self, segment_len: int, mem_len: int, max_offset: int = 0) -> None:
        keys = segment_len + mem_len
        if self.overflow == "error" and keys > self.max_position:
            raise ValueError(
                f"cope: a query may count up to {keys} keys (mem_len {mem_len} + segment_len {segment_len}), past "
                f"max_position={self.max_position}; raise posenc.max_position to at least {keys}, or set "
                f"posenc.overflow=clamp (counts past it read e[max_position], as the authors' code does)"
            )

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """z = q e^T over the P + 1 integer positions: 2 L D (P + 1)."""
        return 2 * segment_len * self.dims.d_model * (self.max_position + 1)

    def scores(self, layer: int, q: Tensor, k: Tensor, pos: Positions, logit_scale: Tensor | None = None) -> Tensor:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> [B, H, L, N] masked scores, -inf where j is not visible;
        the count in fp32 (in bf16 a count past 256 would move in steps of 2). logit_scale lambda: [H, L, 1]
        (SSMax) or None: the scores times lambda_i, the gates (and so the counts) read the unscaled logits."""
        z = q @ self.embedding[layer].to(q.dtype).T  # [B, H, L, P + 1]: z_i[n] = q_i . e[n]
        content = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        if logit_scale is None:
            return _CountedScores.apply(content + mask_to_bias(pos.visible, q.dtype), z).to(q.dtype)  # + q_i . e[p_ij]
        # a finite mask for the gates (sigmoid(-1e4 + z) is 0 in fp32, as sigmoid(-inf)), so that lambda_i times the
        # scores never meets an infinity (lambda_i = 0 at n_i = 1; s may turn negative), then -inf where not visible
        content = content.masked_fill(~pos.visible, FAR)
        scaled = _CountedScores.apply(content, z) * logit_scale.to(torch.float32)
        return (scaled + mask_to_bias(pos.visible, scaled.dtype)).to(q.dtype)

    def extra_repr(self) -> str:
        return f"max_position={self.max_position}, overflow={self.overflow!r}"
