"""Wall attention (Tilde Research, 2026; flash-linear-attention's ``WallAttention``): FoX with a forget gate per
channel instead of per head, a multiplicative decay inside the dot product.

Per layer, a gate for every channel n of every head from each token's layer input x_t (the normalised
[memory ; segment] states k and v are projected from):

    g_tn      = logsigmoid(W x_t + b + b0)_n                   <= 0; b0 = gate_bias (8: f starts at 0.9997)
    P_tn      = sum_{l <= t} g_ln                               cumulative, over the N keys, memory first
    logit_ij  = sum_n q_in k_jn exp(P_in - P_jn) / sqrt(d_h)     exp(P_in - P_jn) = prod_{l=j+1..i} f_ln

fla writes the same thing in base 2 (P = cumsum(g) / ln 2, exp2(P_i - P_j), and the softmax as exp2 of the
logits times 1 / ln 2): a change of unit of its kernels, the same numbers. A channel whose gates stay near 1
carries a key through any distance; one whose gate closes forgets what came before it in that channel only.

No [B, H, L, N, d_h] tensor is built. The queries are taken in blocks of C (``block``); block b, whose first query
sits at key column a_b = M + b C, scales by the anchor R_b = P_{a_b}:

    q~_in = q_in exp(P_in - R_bn)       i >= a_b: P_i <= R_b, the factor is <= 1
    k~_jn = k_jn exp(R_bn - P_jn)       j <= a_b: R_b <= P_j, the factor is <= 1
    q~_i . k~_j = sum_n q_in k_jn exp(P_in - P_jn)

so every factor lies in [0, 1] whatever the gates: nothing overflows, and a factor that underflows to 0 belongs to
a pair whose decay is smaller still (the product of two factors <= 1 is at most either), a term below fp32's
smallest number, at any length M + L. A single reference for the whole row would not be safe: P falls by up to
|g| per token and per channel, so its range over N keys has no bound a float can hold. The keys after a_b inside
the block (fewer than C = 32) have no such anchor; they are the same problem over the block's C tokens with no
memory, solved the same way in blocks of c = 8 (``pair_scores`` calls itself), and inside those one pair at a
time, [B, H, L, c, d_h]; written over the block's columns. The rest is one batched matmul over the query blocks
(each block against all N keys: the FLOPs of one q k^T), the softmax and the values. The logits need every
channel's decay, which no SDPA or flex score_mod takes, so the attention is written out (as CoPE's and
stick-breaking's).

With memory the memory positions' gates come from the memory's own hidden states (the oldest key's gate enters no
pair), so a segment with memory scores exactly as the same tokens at the end of one long run; a static memory's
empty slots get no gate (g = 0) and no share. Choices the paper leaves open, from fla's layer: the gate is a full
linear map, D -> D, one per layer, its weight starting as every linear map's (N(0, 0.02)) and its pre-activation
offset by gate_bias = 8 (fla's ``gate_init_bias``, there the bias's initial value: here a constant added to a
bias that starts at 0, so that the model's initialisation, which zeroes every bias, keeps it); logsigmoid and P in
fp32; the scale 1/sqrt(d_h). fla's options for a FoX-style scalar gate per head besides, an output gate and
QK-norm are architecture (off by default there) and are not offered.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, PositionalScheme, Positions
from .registry import register

#: the block size below which a block's own pairs are computed one by one (above: blocks of it inside the block)
PAIR_BLOCK = 8


def pair_scores(q: Tensor, k: Tensor, P: Tensor, M: int, C: int) -> Tensor:
    """q: [..., L, d], k, P: [..., M + L, d] fp32, query i at key column M + i, L a multiple of C -> [..., L, M + L]
    sum_n q_in k_jn exp(P_in - P_jn) for j <= M + i (later keys: finite, to be masked). Query block b scales by
    its anchor R_b = P at its first query (both factors <= 1 for the keys up to it); the block's own later keys are
    the same problem over C tokens with no memory, solved in blocks of PAIR_BLOCK, and one pair at a time below."""
    L = q.shape[-2]
    Pq = P[..., M:, :].unflatten(-2, (L // C, C))  # the queries' P, block by block
    R = Pq[..., :1, :]  # [..., nb, 1, d]: R_b
    qb, kb = q.unflatten(-2, (L // C, C)), k[..., M:, :].unflatten(-2, (L // C, C))
    q_far = qb * torch.exp(Pq - R)  # q~: exponent <= 0
    k_far = k.unsqueeze(-3) * torch.exp((R - P.unsqueeze(-3)).clamp(max=0))  # k~: exact for j <= a_b, <= 1 always
    far = (q_far @ k_far.transpose(-1, -2)).float()  # [..., nb, C, M + L]
    if C > PAIR_BLOCK and C % PAIR_BLOCK == 0:
        near = pair_scores(qb, kb, Pq, 0, PAIR_BLOCK)  # [..., nb, C, C]
    else:  # per pair (future pairs clamped, then masked)
        decay = torch.exp((Pq.unsqueeze(-2) - Pq.unsqueeze(-3)).clamp(max=0))  # [..., nb, C, C, d]
        near = (qb.unsqueeze(-2) * kb.unsqueeze(-3) * decay).sum(-1)
    columns = (M + torch.arange(L, device=q.device)).view(L // C, 1, C).expand(*near.shape)
    return far.scatter(-1, columns, near).flatten(-3, -2)


@register
class Wall(PositionalScheme):
    name = "wall"
    kind = "relative"
    random_positions_refused = (
        "it reads no position: the order enters only through the forget gates of the tokens between query and key"
    )
    not_translation_invariant = (
        "a pair's decay is the product of the forget gates of the tokens between its two tokens, per channel: it "
        "depends on what lies between them, not on i - j alone"
    )
    #: C, the queries that share an anchor: the per-pair part is [B, H, L, C, d_h], the scaled keys
    #: [B, H, L/C, N, d_h]; near sqrt(N) keeps both small (tests set it lower to cross blocks at small sizes)
    block: int = 32

    def __init__(self, dims: Dims, *, gate_bias: float = 8.0):
        super().__init__(dims)
        if not math.isfinite(gate_bias):
            raise ValueError(f"wall: posenc.gate_bias must be a finite number (8 in fla), got {gate_bias!r}")
        self.gate_bias = float(gate_bias)
        self.gate = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model) for _ in range(dims.n_layer))  # W, b

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The gate projection of every key, memory included (2 N D^2), and each block's own keys computed again
        (2 L C D by sub-blocks, 2 L c D one pair at a time, c = PAIR_BLOCK)."""
        D, L = self.dims.d_model, segment_len
        return 2 * (L + mem_len) * D * D + 2 * L * (min(self.block, L) + min(PAIR_BLOCK, L)) * D

    def cumulative_gates(self, layer: int, context: Tensor, pos: Positions) -> Tensor:
        """context: [B, N, D] -> [B, H, N, d_h] P_tn, fp32."""
        B, N, _ = context.shape
        g = F.logsigmoid(self.gate[layer](context).float() + self.gate_bias)  # g_tn
        g = g.view(B, N, self.dims.n_head, self.dims.d_head).transpose(1, 2)
        if pos.valid is not None:  # a static memory's empty slots: no gate, so P over the keys that exist
            g = g.masked_fill(~pos.valid[:, None], 0.0)
        return g.cumsum(2)

    def logits(
        self,
        layer: int,
        q: Tensor,
        k: Tensor,
        pos: Positions,
        context: Tensor | None,
        logit_scale: Tensor | None = None,
    ) -> Tensor:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> [B, H, L, N] scaled logits, fp32, -inf where not visible;
        logit_scale: [H, L, 1] (SSMax's s_h log n_i, on the whole logit) or None."""
        if context is None:
            raise ValueError("wall: the forget gates come from the layer's input; attend needs context=[B, N, D]")
        B, H, L, d = q.shape
        M = k.shape[2] - L
        P = self.cumulative_gates(layer, context, pos)
        C = min(self.block, L)
        pad = -L % C  # the last block filled with zero queries and keys repeating the last P (cropped below)
        q, k = F.pad(q.float(), (0, 0, 0, pad)), F.pad(k.float(), (0, 0, 0, pad))
        P = torch.cat([P, P[:, :, -1:].expand(B, H, pad, d)], 2)
        logits = pair_scores(q, k, P, M, C)[:, :, :L, : M + L] * d**-0.5
        if logit_scale is not None:
            logits = logits * logit_scale.float()
        return logits.masked_fill(~pos.visible, float("-inf"))

    def attention_probs(
        self,
        layer: int,
        q: Tensor,
        k: Tensor,
        pos: Positions,
        context: Tensor | None = None,
        logit_scale: Tensor | None = None,
    ) -> Tensor:
        return torch.softmax(self.logits(layer, q, k, pos, context, logit_scale), dim=-1).to(q.dtype)

    def attend(
        self,
        layer: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pos: Positions,
        dropout_p: float,
        context: Tensor | None = None,
        logit_scale: Tensor | None = None,
    ) -> Tensor:
        probs = torch.softmax(self.logits(layer, q, k, pos, context, logit_scale), dim=-1)
        return F.dropout(probs, dropout_p).to(v.dtype) @ v  # sum_j p_ij v_j

    def extra_repr(self) -> str:
        return f"gate_bias={self.gate_bias}, block={self.block}"
