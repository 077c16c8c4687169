"""PaTH attention (Yang et al., 2025): the transform between key j and query i is a product of data-dependent
Householder-like matrices, one per token between them; a RoPE whose rotations are learned from the content.

Per layer, from each token's layer input x_t (the model's normalised [memory ; segment] states):

    w_t       = normalize_h(silu(conv3(W_up W_down x)_t))      unit vector per head, d_h wide
    beta_t    = 2 sigmoid(W_beta x_t + b)                      per head, in (0, 2)
    H_t       = I - beta_t w_t w_t^T                           eigenvalue 1 - beta_t along w_t, 1 elsewhere
    s_ij      = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d_h)    (the empty product on the diagonal: q_i . k_j)
    z_i       = softmax_j(s_ij + mask) v

beta in (0, 2) lets H_t reflect (beta near 2) as well as shrink along w_t, never grow: every product has norm
at most 1. Choices the paper leaves open, from flash-linear-attention's ``PaTHAttention`` (the authors' kernel):
w is L2-normalised per head (in fp32 here; fla: "important for precision") after a causal depthwise convolution
of width 3 with SiLU (``short_conv``) of a low-rank projection (``w_rank`` 32: D -> 32 -> D); beta's projection
has a bias, starting at 0 (beta = 1); every linear map starts as the model's others. PaTH-FoX (PaTH with FoX's
gate) is the two schemes together and is not offered.

The chunked form (the UT transform, as the authors' kernel; no d_h x d_h matrix per pair). The keys are cut
into chunks of C = 64 tokens (queries start a chunk; padding tokens have H = I). In a chunk, with
A_ta = beta_t w_t . w_a for a < t and T = (I + A)^{-1} (a triangular solve):

    Y = T diag(beta) W                                   so that H_t ... H_1 = I - sum_{a <= t} w_a y_a^T
    U = I - W^T Y                                        the chunk's whole product, d_h x d_h, once per chunk
    G = T strict_lower(diag(beta) W K^T)                 k~_u = k_u - sum_a G_au w_a: key u carried to the chunk's end
    q~_t = q_t - sum_{a <= t} (q_t . w_a) y_a            query t carried back to its chunk's start
    s_tu = q_t . k_u - sum_{a <= t} (q_t . w_a) G_au     pairs within one chunk (u <= t)
    s_tu = q~_t^T U_{c-1} ... U_{c'+1} k~_u              query chunk c, key chunk c' < c: q~ carried one chunk
                                                         at a time, a [C, d_h] x [d_h, d_h] product per chunk pair

so the cost is that of attention's scores plus one such product per pair of chunks. The softmax runs row by row of
query chunks, over the keys up to the row's own chunk (later keys are never visible: neither computed nor
normalised), the mask added to each row whole (choosing the blocks that need it would read the mask on the host
every step, a sync and a graph break). With memory the transforms of
memory positions come from the memory's own states (the memory holds each layer's input) and the product runs
back through them: a segment with memory scores as the same tokens at the end of one long run. One boundary: the
convolution of the first two memory positions sees zeros where a longer run would see the tokens before the
memory; it moves only the transform of the one or two oldest keys (``short_conv: false`` has none).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import AttentionInputs, Dims, PositionalScheme, mask_to_bias
from .registry import register

CHUNK = 64  # C: tokens per chunk (the authors' kernel's); the scores do not depend on it


def path_rows(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int = CHUNK) -> tuple[list[Tensor], int]:
    """q: [B, H, L, d_h] (already scaled), k, w: [B, H, N, d_h] (w unit), beta: [B, H, N] -> (rows, front): the
    scores s_ij = q_i^T H_{M+i} ... H_{j+1} k_j of each query chunk c, [B, H, C, (m0 + c + 1) C], over the keys
    padded by ``front`` in front (and the queries and keys by as many at the back as make whole chunks), up to
    the chunk's own: later keys are never visible. Entries past a query's own key: any value (masked)."""
    B, H, L, d = q.shape
    N, C = k.shape[2], chunk
    M = N - L
    front, back = (-M) % C, (-L) % C  # padding so that the queries start a chunk and end one
    n, m0, nq = (front + N + back) // C, (front + M) // C, (L + back) // C  # chunks, first query chunk, query chunks
    K, W = (F.pad(x, (0, 0, front, back)).view(B, H, n, C, d) for x in (k, w))
    Q = F.pad(q, (0, 0, 0, back)).view(B, H, nq, C, d)
    bW = F.pad(beta, (front, back)).view(B, H, n, C, 1) * W  # padding: beta = 0, w = 0, H = I
    below = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    unit_lower = (bW @ W.transpose(-1, -2)).masked_fill(~below, 0.0)  # A (the unit diagonal is implied)

    def solve(rhs: Tensor) -> Tensor:  # T rhs = (I + A)^{-1} rhs
        return torch.linalg.solve_triangular(unit_lower, rhs, upper=False, unitriangular=True)

    Y = solve(bW)  # [B, H, n, C, d]
    G = solve((bW @ K.transpose(-1, -2)).masked_fill(~below, 0.0))  # [B, H, n, C, C]
    K_end = K - G.transpose(-1, -2) @ W  # k~
    U = torch.eye(d, device=q.device, dtype=q.dtype) - W.transpose(-1, -2) @ Y  # [B, H, n, d, d]
    QW = (Q @ W[:, :, m0:].transpose(-1, -2)).tril()  # q_t . w_a, a <= t, in the query's own chunk
    local = (Q @ K[:, :, m0:].transpose(-1, -2) - QW @ G[:, :, m0:]).unbind(2)  # pairs within a chunk
    carried = (Q - QW @ Y[:, :, m0:]).unbind(2)  # q~ of each query chunk
    K_end, U = K_end.unbind(2), U.unbind(2)  # per chunk (unbind's backward is one stack, a slice's a zero fill)
    rows = []
    for c in range(nq):  # query chunk c (chunk m0 + c): key chunks 0 .. m0 + c
        q_back, row = carried[c], [local[c]]
        for kc in range(m0 + c - 1, -1, -1):  # earlier key chunks, nearest first
            row.append(q_back @ K_end[kc].transpose(-1, -2))
            if kc:  # one chunk further back: through U of the chunk just passed
                q_back = q_back @ U[kc]
        rows.append(torch.cat(row[::-1], dim=-1))
    return rows, front


def path_scores(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int = CHUNK) -> Tensor:
    """``path_rows`` as one [B, H, L, N] tensor s_ij (later keys: any value, masked)."""
    L, N = q.shape[2], k.shape[2]
    rows, front = path_rows(q, k, w, beta, chunk)
    width = rows[-1].shape[-1]
    scores = torch.cat([F.pad(row, (0, width - row.shape[-1])) for row in rows], dim=-2)
    return scores[:, :, :L, front : front + N]


@register
class PaTH(PositionalScheme):
    name = "path"
    kind = "relative"
    family = "data-dependent transform"
    positions_enter = "`q_i^T H_i ... H_{j+1} k_j`, `H_t = I - beta_t w_t w_t^T` from the layer input"
    with_memory = "transforms of memory from its own states"
    compile_slower = (
        "its compiled training step took 2.1-4.7x the eager one on a 2-core CPU (tiny, small and base, "
        "docs/PERFORMANCE.md); not measured on a GPU"
    )
    random_positions_refused = (
        "it reads no position: the transform between two tokens is the product of the Householder-like matrices "
        "of the tokens between them"
    )
    not_translation_invariant = (
        "the transform between two tokens is the product of the data-dependent H_t of the tokens between them: it "
        "depends on what lies between them, not on i - j alone"
    )

    def __init__(self, dims: Dims, *, w_rank: int | None = 32, short_conv: bool = True):
        super().__init__(dims)
        if w_rank is not None and w_rank < 1:
            raise ValueError(f"path: posenc.w_rank must be an integer >= 1 or null (a full D x D map), got {w_rank!r}")
        self.w_rank, self.short_conv = w_rank, short_conv
        D, H = dims.d_model, dims.n_head

        def w_proj() -> nn.Module:
            return (
                nn.Linear(D, D, bias=False)
                if w_rank is None
                else nn.Sequential(nn.Linear(D, w_rank, bias=False), nn.Linear(w_rank, D, bias=False))
            )

        self.w = nn.ModuleList(w_proj() for _ in range(dims.n_layer))
        self.conv = nn.ModuleList(
            nn.Conv1d(D, D, 3, groups=D, bias=False) for _ in range(dims.n_layer if short_conv else 0)
        )
        self.beta = nn.ModuleList(nn.Linear(D, H) for _ in range(dims.n_layer))

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """w's and beta's projections of every key, 2 N D (2 rank + H) (2 N D (D + H) at full rank), and the chunked
        transform's products beyond attention's scores: per key about 8 C D + 2 D d_h, per query 4 C D + 2 C C H
        and one [d_h, d_h] product per earlier chunk, 2 D d_h N / C."""
        L, N, D, H, C = segment_len, segment_len + mem_len, self.dims.d_model, self.dims.n_head, CHUNK
        d_h = self.dims.d_head
        proj = 2 * N * D * ((D if self.w_rank is None else 2 * self.w_rank) + H)
        return proj + N * (8 * C * D + 2 * D * d_h) + L * (4 * C * D + 2 * C * C * H + 2 * D * d_h * N / C)

    def transforms(self, layer: int, context: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """context: [B, N, D] -> (w [B, H, N, d_h] unit, beta [B, H, N]), fp32; valid: [N] bool, the keys that exist
        (None: all): the others get w = 0, H = I, and the convolution sees zeros there, as before a stream's start."""
        B, N, _ = context.shape
        w = self.w[layer](context)
        if valid is not None:
            w = w * valid[:, None].to(w.dtype)
        if self.short_conv:  # causal: position t sees t-2, t-1, t (zeros before the first)
            w = F.silu(F.conv1d(F.pad(w.transpose(1, 2), (2, 0)), self.conv[layer].weight, groups=w.shape[-1]))
            w = w.transpose(1, 2)
        w = F.normalize(w.float().view(B, N, self.dims.n_head, -1).transpose(1, 2), dim=-1)
        beta = 2 * torch.sigmoid(self.beta[layer](context).float()).transpose(1, 2)
        return w, beta

    def _inputs(self, a: AttentionInputs) -> tuple[Tensor, Tensor, Tensor]:
        """(lambda q / sqrt(d_h), w, beta) in fp32 (a triangular solve per chunk: no bf16 kernel); SSMax's lambda
        [H, L, 1] (``a.softmax.scale``, None: 1): s_ij is linear in q_i, so lambda_i q_i scales the row's scores."""
        if a.context is None:
            raise ValueError("path: the transforms come from the layer's input; attend needs context=[B, N, D]")
        w, beta = self.transforms(a.layer, a.context, a.pos.valid)
        q, logit_scale = (a.q * a.q.shape[-1] ** -0.5).float(), a.softmax.scale
        return (q if logit_scale is None else q * logit_scale.float()), w, beta

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        q, w, beta = self._inputs(a)
        with torch.autocast(q.device.type, enabled=False):
            scores = path_scores(q, a.k.float(), w, beta) + mask_to_bias(a.pos.visible, torch.float32)
        return a.softmax.probs(scores).to(a.k.dtype)

    def attend(self, a: AttentionInputs) -> Tensor:
        """Row by row of query chunks: each row's softmax over its keys up to its own chunk (later keys are never
        visible, so they are neither computed nor normalised), the mask added, one product with the matching keys'
        values."""
        k, v, pos, softmax, dropout_p = a.k, a.v, a.pos, a.softmax, a.dropout_p
        L, N = a.q.shape[2], k.shape[2]
        q, w, beta = self._inputs(a)
        with torch.autocast(q.device.type, enabled=False):
            rows, front = path_rows(q, k.float(), w, beta)
            C = rows[0].shape[-2]
            back = len(rows) * C - L
            visible = F.pad(pos.visible, (front, back, 0, back))  # padding keys invisible; padding queries
            visible[L:, front + N :] = True  # (discarded) see their padding keys, so that no row is empty
            values = F.pad(v.float(), (0, 0, front, back))
            out = []
            for c, row in enumerate(rows):
                row = row + mask_to_bias(visible[c * C : (c + 1) * C, : row.shape[-1]], row.dtype)
                probs = softmax.probs(row)
                if dropout_p > 0:
                    probs = F.dropout(probs, dropout_p)
                out.append(probs @ values[:, :, : row.shape[-1]])
        return torch.cat(out, dim=-2)[:, :, :L].to(v.dtype)

    def extra_repr(self) -> str:
        return f"w_rank={self.w_rank}, short_conv={self.short_conv}"
