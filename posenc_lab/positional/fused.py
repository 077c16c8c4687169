"""The fused attention path of the relative schemes: ``flex_attention``, no [B, H, L, N] probabilities.

``flex_attention`` computes softmax(q k^T / sqrt(d_h) + score_mod) v block by block (online softmax,
as in FlashAttention) and differentiates into the tensors a ``score_mod`` reads. Every scheme with a
score bias (``base.ScoreBias``) is a score_mod over the query i in [0, L) and the key column j in [0, N),
N = M + L, plus the visibility mask as a block mask; xl and shaw have their own:

    alibi  s + table[h, d]                  table = -m_h d                    [H, N]   d = i - j + M
    t5     s + table[h, d]                  table = b_h(bucket(d))            [H, N]
    kerple_log, kerple_power, sandwich      the same, their kernel of d       [H, N]
    fire   s + bias[h, i, j]                bias = f(psi(d) / psi(max(L, i)))  [H, L, N]
    fox    s + C[b, h, M + i] - C[b, h, j]  C = cumsum of the log forget gates  [B, H, N]
    xl     (q_i + u) . k_j / sqrt(d_h) + bd[b, h, i, d],
                                            bd = (q_i + v) . W_{k,R} R_d / sqrt(d_h)   [B, H, L, N]
    shaw   s + qa[b, h, i, min(d, K)],      qa = q_i . a^K_{K-d} / sqrt(d_h)           [B, H, L, K+1]

With ``model.random_positions`` the positions have gaps: the tables then cover every distance up to the
largest (D + 1 columns instead of N) and the column of a pair is read from its positions.

xl's per-distance table is as large as one probability matrix, but it is read once and never
normalised, stored for the softmax or written back per pair. Shaw's value term needs the
probabilities of the K nearest keys only, rebuilt from the log-sum-exp flex returns:

    z_i = flex(q, k, v)_i + a^V_0 + sum_{d < K} exp(e_{i,i-d} - lse_i) (a^V_{K-d} - a^V_0)

Where it runs: ``flex_attention`` needs ``torch.compile`` (eager it is a slow reference), and
torch (2.13) refuses its backward on CPU, and its log-sum-exp output (Shaw) on CPU. ``auto`` takes
it on CUDA only, and only where it was measured faster (an H200, bf16, docs/PERFORMANCE.md): each
scheme's ``fused_from_keys`` says from how many keys (M + L) on: t5 always (its bias gradient makes
the unfused step 2.2x slower), xl from 1024 (below, reading the [B, H, L, N] table in the kernel costs
more than the softmax it saves), alibi and shaw never (SDPA with a fixed bias, and Shaw's per-distance
correction, beat it). The schemes added later were not measured on a GPU; they follow the measured scheme
they resemble: kerple_log, kerple_power, fire and fox (a learned bias, whose gradient SDPA cannot give) as t5,
sandwich (a fixed bias) as alibi. On CPU training cannot use it, and for evaluation compiling costs 30-140 s per
shape on 2 cores for a kernel that was no faster (docs/PERFORMANCE.md).
``fused`` forces it (CPU: evaluation of xl, t5, alibi), failing with the
reason where it cannot run; ``unfused`` keeps the schemes' own explicit attention. Attention
dropout is not part of flex_attention: with ``attn_dropout > 0`` the unfused path runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .positions import Positions

try:
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
except ImportError:  # torch without flex_attention: the unfused path only
    flex_attention = None

IMPLS = ("auto", "fused", "unfused")
#: True: run flex_attention uncompiled (torch's dense reference, differentiable wherever torch lets it
#: run), so tests can check on CPU the score_mods and corrections that CUDA runs compiled.
REFERENCE = False
_compiled_flex = None
_block_masks: dict = {}


def _flex():
    """flex_attention compiled once per process (it is a slow reference implementation uncompiled)."""
    global _compiled_flex
    if REFERENCE:
        return flex_attention
    if _compiled_flex is None:
        # one compiled kernel per (score_mod, shape, grad mode): a run needs a few, a benchmark many;
        # past dynamo's default limit (8) it would fall back to the dense reference without a word
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def reset() -> None:
    """Forget the compiled kernels and the cached block mask (the benchmark, between its points)."""
    global _compiled_flex
    _compiled_flex = None
    _block_masks.clear()
    import torch._dynamo

    torch._dynamo.reset()


def why_not(q: Tensor, dropout_p: float, needs_lse: bool = False) -> str | None:
    """Why the fused path cannot run for these inputs, or None if it can. ``needs_lse``: the scheme
    needs flex's log-sum-exp (Shaw)."""
    if flex_attention is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    if dropout_p > 0:
        return f"flex_attention has no attention dropout (model.attn_dropout={dropout_p})"
    if q.device.type == "cpu" and torch.is_grad_enabled() and not REFERENCE:
        return f"torch {torch.__version__}'s flex_attention has no backward on CPU"
    if q.device.type == "cpu" and needs_lse and not REFERENCE:
        return f"torch {torch.__version__}'s compiled flex_attention on CPU returns no log-sum-exp"
    if q.device.type not in ("cpu", "cuda"):
        return f"flex_attention does not run on {q.device.type}"
    return None


def use_fused(scheme, q: Tensor, k: Tensor, dropout_p: float, needs_lse: bool = False) -> bool:
    """Take the fused path for ``scheme`` (its ``attention_impl``: auto | fused | unfused, see the module
    docstring; auto on CUDA from its ``fused_from_keys`` keys on)? k: [B, H, M + L, d_h]."""
    impl, from_keys = scheme.attention_impl, scheme.fused_from_keys
    if impl == "unfused":
        return False
    reason = why_not(q, dropout_p, needs_lse)
    if impl == "fused" and reason is not None:
        raise RuntimeError(
            f"model.attention_impl=fused cannot run here: {reason}; "
            f"use model.attention_impl=auto (fused where it can run) or unfused"
        )
    if impl not in IMPLS:
        raise ValueError(f"model.attention_impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if reason is not None:
        return False
    if impl == "fused":
        return True
    return q.device.type == "cuda" and from_keys is not None and k.shape[2] >= from_keys


def block_mask(pos: Positions):
    """The visibility mask as a flex BlockMask (fully masked blocks are skipped); built once per
    ``Positions`` (one per forward, shared by the layers)."""
    if _block_masks.get("visible") is not pos.visible:
        visible = pos.visible
        L, N = visible.shape
        _block_masks["visible"] = visible
        _block_masks["mask"] = create_block_mask(
            lambda b, h, i, j: visible[i, j], None, None, L, N, device=str(visible.device)
        )
    return _block_masks["mask"]


def distances(pos: Positions) -> Tensor:
    """[D + 1] the distances D .. 0 a per-distance table covers, D = ``pos.max_distance``: column c of every
    per-distance table holds distance D - c. Consecutive positions: the last query's distance to every key
    (D = N - 1); with gaps (``model.random_positions``): every distance up to the largest."""
    if pos.consecutive:
        return pos.q[-1] - pos.k
    return torch.arange(pos.max_distance, -1, -1, device=pos.q.device)


def column(pos: Positions):
    """(i, j) -> the table column of the pair, D - (q_i - k_j); future keys (masked anyway) read the distance-0
    column, so that every read is in bounds. Consecutive positions: L-1-i+j from the indices alone; with gaps
    the positions are read from q and k."""
    L, N = pos.visible.shape
    if pos.consecutive:
        return lambda i, j: torch.clamp(L - 1 - i + j, max=N - 1)
    D = torch.tensor(pos.max_distance, device=pos.q.device)
    q, k = pos.q, pos.k
    return lambda i, j: torch.minimum(D - (q[i] - k[j]), D)


def attend_bias(q: Tensor, k: Tensor, v: Tensor, pos: Positions, score_mod: Callable) -> Tensor:
    """softmax(q k^T / sqrt(d_h) + b_ij) v, ``score_mod`` adding b_ij per pair: a ``ScoreBias``'s (base.py: a
    per-distance table read at the pair's ``column``, a per-pair tensor, or two entries of a cumulative sum)."""
    return _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask(pos))


def attend_xl(q_u: Tensor, k: Tensor, v: Tensor, pos: Positions, bd: Tensor) -> Tensor:
    """softmax((q_i + u) . k_j / sqrt(d_h) + bd[b, h, i, col(i, j)]) v.  q_u: q + u;
    bd: [B, H, L, D + 1] (b)+(d) already scaled, column c: distance D-c (``distances``)."""
    pair_column = column(pos)

    def score_mod(s, b, h, i, j):
        return s + bd[b, h, i, pair_column(i, j)]

    return _flex()(q_u, k, v, score_mod=score_mod, block_mask=block_mask(pos))


def attend_shaw(q: Tensor, k: Tensor, v: Tensor, pos: Positions, qa: Tensor, a_value: Tensor) -> Tensor:
    """Shaw's attention (see the module docstring). qa: [B, H, L, K+1], column d: q_i . a^K_{K-d} / sqrt(d_h)
    (d = K: every distance >= K); a_value: [2K+1, d_h] this layer's a^V."""
    if not pos.consecutive:
        raise RuntimeError(
            "model.attention_impl=fused: shaw's fused path reads its K nearest keys as diagonals, which needs "
            "consecutive positions, not model.random_positions; use attention_impl=auto or unfused"
        )
    B, H, L, d_h = q.shape
    N, K = k.shape[2], qa.shape[-1] - 1
    M, n = N - L, min(K, N)

    def score_mod(s, b, h, i, j):
        return s + qa[b, h, i, torch.clamp(M + i - j, 0, K)]

    out, aux = _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask(pos), return_aux=AuxRequest(lse=True))
    # e_{i, i-d} for the n nearest distances d < n: key column M + i - d (padded in front where M < n - 1)
    k_pad = torch.nn.functional.pad(k, (0, 0, n - 1, 0))
    vis_pad = torch.nn.functional.pad(pos.visible, (n - 1, 0))
    rows = torch.arange(L, device=q.device)
    near = torch.stack([torch.linalg.vecdot(q, k_pad[:, :, M - d + n - 1 : M - d + n - 1 + L]) for d in range(n)], -1)
    near = near * d_h**-0.5 + qa[..., :n]  # [B, H, L, n]
    seen = torch.stack([vis_pad[rows, rows + M - d + n - 1] for d in range(n)], -1)  # [L, n]
    p_near = torch.exp(near - aux.lse[..., None].to(near.dtype)).masked_fill(~seen, 0.0)
    rows_v = a_value[K - torch.arange(n, device=q.device)] - a_value[0]  # [n, d_h]: a^V_{K-d} - a^V_0
    return out + (p_near.to(v.dtype) @ rows_v.to(v.dtype) + a_value[0].to(v.dtype))
