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

No [B, H, L, N, d_h] tensor is built. The pairs are taken by pieces, a block of queries against a block of earlier
keys, each with an anchor R = P at the piece's first query (after every key of the piece, no later than any query):

    q~_in = q_in exp(P_in - R_n)       the piece's queries: P_i <= R, the factor is <= 1
    k~_jn = k_jn exp(R_n - P_jn)       the piece's keys:    R <= P_j, the factor is <= 1
    q~_i . k~_j = sum_n q_in k_jn exp(P_in - P_jn)

so every factor lies in [0, 1] whatever the gates: nothing overflows, and a factor that underflows to 0 belongs to
a pair whose decay is smaller still (the product of two factors <= 1 is at most either), a term below fp32's
smallest number, at any length M + L. A single reference for the whole row would not be safe: P falls by up to
|g| per token and per channel, so its range over N keys has no bound a float can hold. The pieces (``pieces``):
the memory keys against every query; then the segment halved, the second half's queries against the first half's
keys; each half halved again, and so on down to leaves of c queries (L padded to c 2^n, ``split``; c = 1 at the
powers of two), whose own pairs are taken one at a time, [B, H, L, c, d_h] (c = 1: the diagonal, decay 1). Every
pair below the diagonal is computed once, by one matmul a level, written in place into the [B, H, L, N] logits;
the scaled q and k are O(L log L) rows a head. The backward (``_Scores``) recomputes them from q, k and P instead
of saving them; R gets no gradient, since q~_i . k~_j does not depend on it. Then the softmax and the values: the
logits need every channel's decay, which no SDPA or flex score_mod takes, so the attention is written out (as
CoPE's and stick-breaking's).

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

from .base import AttentionInputs, Dims, PositionalScheme, Positions, Softmax
from .registry import register

#: a leaf pair's cost (elementwise over d_h, forward and backward) in matmul pairs, rough on CPU: it weighs a larger
#: leaf against more padding when ``split`` chooses c
LEAF_COST = 150


def split(L: int, M: int, leaf: int | None = None) -> tuple[int, int]:
    """(c, n): the L queries padded to c 2^n, halved n times down to leaves of c; c = ``leaf`` if given, else the
    cheapest by pairs, Lp (Lp + 2 M) by matmul and Lp c LEAF_COST at the leaves (L = 256: c = 1, no padding)."""
    if leaf is not None:
        n = max(0, math.ceil(math.log2(L / leaf)))
        return leaf, n
    cost = {
        n: -(-L // 2**n) * 2**n * (-(-L // 2**n) * 2**n + 2 * M + LEAF_COST * -(-L // 2**n))
        for n in range(L.bit_length())
    }
    n = min(cost, key=cost.get)
    return -(-L // 2**n), n


def block_diagonal(S: Tensor, s: int, offset: int) -> Tensor:
    """S: [..., T, T] -> [..., T / s or T / 2s, s, s], a view: the s x s blocks on the diagonal (offset 0), or those
    just below it that pair the two halves of each 2s x 2s diagonal block (offset -1)."""
    blocks = S.unflatten(-1, (-1, s)).unflatten(-3, (-1, s)).diagonal(offset, -4, -2)  # [..., s, s, T/s - |offset|]
    return (blocks[..., ::2] if offset else blocks).movedim(-1, -3)


def pieces(M: int, c: int, n: int):
    """(scores, queries, keys) views of each product piece: the memory (anchor: the first query), then each level of
    halves (anchor: the second half's first query). scores: of [..., L, N]; queries: of [..., L, d]; keys: of
    [..., N, d]."""
    if M:
        yield (lambda S: S[..., :M]), (lambda x: x), (lambda x: x[..., :M, :])
    for s in (c * 2**e for e in reversed(range(n))):
        yield (
            lambda S, s=s: block_diagonal(S[..., M:], s, -1),
            lambda x, s=s: x.unflatten(-2, (-1, s))[..., 1::2, :, :],
            lambda x, s=s: x[..., M:, :].unflatten(-2, (-1, s))[..., ::2, :, :],
        )


class _Scores(torch.autograd.Function):
    """q: [..., L, d] (L = c 2^n), k, P: [..., N, d] fp32, N = M + L, query i at key column M + i; hidden: [L, N] bool
    (every j > M + i among them) -> [..., L, N]: sum_n q_in k_jn exp(P_in - P_jn), -inf where hidden. The backward
    recomputes the scaled q and k (O(L d log L)), saving only the inputs."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, P: Tensor, c: int, n: int, hidden: Tensor) -> Tensor:
        M = k.shape[-2] - q.shape[-2]
        ctx.save_for_backward(q, k, P)
        ctx.c, ctx.n = c, n
        S = q.new_empty(*q.shape[:-1], k.shape[-2])
        for scores, qs, ks in pieces(M, c, n):
            eq, ek = factors(P, M, qs, ks)
            # q~ k~^T (not matmul's out=: into a strided view, 2 CPU threads took 25x as long)
            scores(S).copy_(eq.mul_(qs(q)) @ ek.mul_(ks(k)).transpose(-1, -2))
        if c == 1:  # the diagonal alone, decay 1
            S[..., M:].diagonal(0, -2, -1).copy_((q * k[..., M:, :]).sum(-1))
        else:
            qc, kc, decay = leaves(q, k, P, c)
            pair = qc.unsqueeze(-2) * kc.unsqueeze(-3) * decay  # [..., L / c, c, c, d]
            block_diagonal(S[..., M:], c, 0).copy_(pair.sum(-1))
        return S.masked_fill_(hidden, float("-inf"))

    @staticmethod
    def backward(ctx, dS: Tensor):
        q, k, P = ctx.saved_tensors
        M, c = k.shape[-2] - q.shape[-2], ctx.c
        dq, dk, dP = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(P)
        for scores, qs, ks in pieces(M, c, ctx.n):
            eq, ek = factors(P, M, qs, ks)
            qt, kt, g = qs(q) * eq, ks(k) * ek, scores(dS)
            dqt, dkt = g @ kt, g.transpose(-1, -2) @ qt  # d/dq~, d/dk~
            qs(dq).addcmul_(dqt, eq)
            ks(dk).addcmul_(dkt, ek)
            qs(dP[..., M:, :]).addcmul_(dqt, qt)  # d q~_in / d P_in = q~_in (the anchor: no gradient, see factors)
            ks(dP).addcmul_(dkt, kt, value=-1.0)  # d k~_jn / d P_jn = -k~_jn
        if c == 1:  # the diagonal alone, decay 1
            g = dS[..., M:].diagonal(0, -2, -1).unsqueeze(-1)
            dq.addcmul_(g, k[..., M:, :])
            dk[..., M:, :].addcmul_(g, q)
            return dq, dk, dP, None, None, None
        qc, kc, decay = leaves(q, k, P, c)
        g = block_diagonal(dS[..., M:], c, 0).tril().unsqueeze(-1)  # [..., L / c, c, c, 1]; future pairs have none
        w = g * decay  # dS_ij exp(P_in - P_jn)
        a = w * kc.unsqueeze(-3)
        u = a * qc.unsqueeze(-2)  # dS_ij q_in k_jn exp(P_in - P_jn)
        dq.unflatten(-2, (-1, c)).add_(a.sum(-2))
        dk[..., M:, :].unflatten(-2, (-1, c)).add_((w * qc.unsqueeze(-2)).sum(-3))
        dP[..., M:, :].unflatten(-2, (-1, c)).add_(u.sum(-2)).sub_(u.sum(-3))
        return dq, dk, dP, None, None, None


def factors(P: Tensor, M: int, qs, ks) -> tuple[Tensor, Tensor]:
    """A piece's exp(P_in - R_n) for its queries and exp(R_n - P_jn) for its keys, both <= 1: R = P at the piece's
    first query, after every key and no later than any query. q~_i . k~_j does not depend on R, so R gets no
    gradient."""
    Pq = qs(P[..., M:, :])
    R = Pq[..., :1, :]
    return (Pq - R).exp_(), (R - ks(P)).exp_()


def leaves(q: Tensor, k: Tensor, P: Tensor, c: int) -> tuple[Tensor, Tensor, Tensor]:
    """The leaves' queries and keys [..., L / c, c, d] and each pair's decay [..., L / c, c, c, d] one at a time,
    exp(P_in - P_jn), clamped at 1 for the future pairs (masked)."""
    M = k.shape[-2] - q.shape[-2]
    qc, kc, Pc = q.unflatten(-2, (-1, c)), k[..., M:, :].unflatten(-2, (-1, c)), P[..., M:, :].unflatten(-2, (-1, c))
    return qc, kc, (Pc.unsqueeze(-2) - Pc.unsqueeze(-3)).clamp_(max=0).exp_()


@register
class Wall(PositionalScheme):
    name = "wall"
    kind = "relative"
    family = "data-dependent, per channel"
    positions_enter = "`sum_n q_in k_jn prod_{l=j+1..i} f_ln`, a forget gate per channel from the layer input"
    with_memory = "gates of memory from its own states"
    random_positions_refused = (
        "it reads no position: the order enters only through the forget gates of the tokens between query and key"
    )
    not_translation_invariant = (
        "a pair's decay is the product of the forget gates of the tokens between its two tokens, per channel: it "
        "depends on what lies between them, not on i - j alone"
    )
    #: c, the leaves' size (their pairs one at a time); None: chosen by ``split`` (tests set it to cross levels)
    leaf: int | None = None

    def __init__(self, dims: Dims, *, gate_bias: float = 8.0):
        super().__init__(dims)
        if not math.isfinite(gate_bias):
            raise ValueError(f"wall: posenc.gate_bias must be a finite number (8 in fla), got {gate_bias!r}")
        self.gate_bias = float(gate_bias)
        self.gate = nn.ModuleList(nn.Linear(dims.d_model, dims.d_model) for _ in range(dims.n_layer))  # W, b

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The gate projection of every key, memory included (2 N D^2); the scores take each visible pair once by
        matmuls (the leaves' few elementwise), no more than q k^T."""
        return 2 * (segment_len + mem_len) * self.dims.d_model**2

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
        c, n = split(L, M, self.leaf)
        pad = c * 2**n - L  # zero queries and keys repeating the last P (g = 0), cropped below
        scale = d**-0.5 if logit_scale is None else d**-0.5 * logit_scale.float()  # the logit is linear in q_i
        q, k = q.float() * scale, k.float()
        if pad:
            q, k = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))
            P = torch.cat([P, P[:, :, -1:].expand(B, H, pad, d)], 2)
        columns = torch.arange(M + L + pad, device=q.device)
        hidden = F.pad(~pos.visible, (0, pad, 0, pad), value=True) | (columns > M + columns[: L + pad, None])
        return _Scores.apply(q, k, P, c, n, hidden)[:, :, :L, : M + L]

    def probs(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None, softmax: Softmax
    ) -> Tensor:
        """[B, H, L, N] fp32: softmax_j(logit_ij), the one path of ``attend`` and ``attention_probs``."""
        return softmax.probs(self.logits(layer, q, k, pos, context, softmax.scale))

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        return self.probs(a.layer, a.q, a.k, a.pos, a.context, a.softmax).to(a.q.dtype)

    def attend(self, a: AttentionInputs) -> Tensor:
        probs = self.probs(a.layer, a.q, a.k, a.pos, a.context, a.softmax)
        return F.dropout(probs, a.dropout_p).to(a.v.dtype) @ a.v  # sum_j p_ij v_j, dropped in fp32

    def extra_repr(self) -> str:
        return f"gate_bias={self.gate_bias}, leaf={self.leaf}"
