"""PoPE, polar coordinate position embeddings (Gopalakrishnan, Csordás, Schmidhuber, Mozer 2025).

RoPE rotates channel pairs that already have an angle of their own (the content's), so what is matched (the
content) and where (the position) mix in one angle. PoPE gives every channel c of a head a magnitude from the
content and a phase from the position alone:

    mu_ic   = softplus(q_ic),   nu_jc = softplus(k_jc)                    >= 0: the "what"
    phi_ic  = i theta_c,        psi_jc = j theta_c + delta_hc             the "where"; theta_c = base^{-c/d_h}
    a_ij    = sum_c mu_ic nu_jc cos((i - j) theta_c - delta_hc) / sqrt(d_h)

with d_h frequencies (one per channel, not d_h/2 as RoPE's pairs) and a learned phase delta_hc in [-2 pi, 0].
No per-pair tensor is built: cos(A - B) = cos A cos B + sin A sin B, so a_ij is the dot product of the 2 d_h-wide
vectors [mu cos phi ; mu sin phi] and [nu cos psi ; nu sin psi], which ``rotate`` returns and SDPA (or flash)
multiplies. SDPA scales by 1/sqrt(2 d_h), its width; the query is multiplied by sqrt(2) so that the scores are
scaled by 1/sqrt(d_h), the head size, as x-transformers' ``Attend`` does (``scale = dim_head ** -0.5``).

Memory keys sit at their negative positions -M..-1, as RoPE's; under ``model.random_positions`` the sampled
positions are read as given (the score depends on i - j only, and is computed for any i, j).

Choices the paper leaves open, from x-transformers' ``PolarEmbedding`` (the maintained implementation): one
delta per head and frequency, shared by every layer (x-transformers builds one ``PolarEmbedding`` for the
whole stack), starting at 0 (``phase_init: zero``; ``uniform`` draws it from U[-2 pi, 0], x-transformers'
``polar_bias_uniform_init``); the frequencies base^{-c/d_h}, c = 0..d_h-1, base 10000; softplus and the
trigonometry in fp32. x-transformers clamps delta inside its forward, which stops the gradient of a phase that
left the range; here the phase is projected back after each optimiser step (``constrained``, as KERPLE's
parameters), so the forward values are the same and a phase on the boundary keeps learning.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dims, PositionalScheme, Positions
from .registry import register

PHASE_INITS = ("zero", "uniform")


@register
class PoPE(PositionalScheme):
    name = "pope"
    kind = "relative"
    family = "relative, polar"
    positions_enter = (
        "`sum_c softplus(q_ic) softplus(k_jc) cos((i - j) theta_c - delta_hc)`: magnitude from content, phase"
        " from position"
    )
    with_memory = "memory at negative positions"
    projected = {"phase": (-2 * math.pi, 0.0)}

    def __init__(self, dims: Dims, *, base: float = 10000.0, phase_init: str = "zero"):
        super().__init__(dims)
        if not math.isfinite(base) or base <= 1:
            raise ValueError(f"pope: posenc.base must be a number > 1 (10000 in the paper), got {base!r}")
        if phase_init not in PHASE_INITS:
            raise ValueError(f"pope: posenc.phase_init must be one of {', '.join(PHASE_INITS)}, got {phase_init!r}")
        self.base, self.phase_init = float(base), phase_init
        d = dims.d_head
        self.register_buffer("inv_freq", base ** (-torch.arange(d, dtype=torch.float32) / d), persistent=False)
        self.phase = nn.Parameter(torch.zeros(dims.n_head, d))  # delta_hc, shared by the layers
        if phase_init == "uniform":
            with torch.no_grad():
                self.phase.uniform_(-2 * math.pi, 0.0)

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The scores over 2 d_h channels instead of d_h: 2 L N D more."""
        return 2 * segment_len * (segment_len + mem_len) * self.dims.d_model

    def rotate(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> [B, H, L, 2 d_h], [B, H, N, 2 d_h] (the polar vectors)."""
        delta = self.constrained("phase")  # [H, d_h]
        phi = pos.q.to(torch.float32)[:, None] * self.inv_freq  # [L, d_h]: i theta_c
        psi = pos.k.to(torch.float32)[:, None] * self.inv_freq + delta[:, None, :]  # [H, N, d_h]: j theta_c + delta
        # contiguous: from the model's transposed views, compile's backward (aot_eager) views a gradient it laid out
        # otherwise and fails (tests/test_compile.py); sqrt(2): SDPA scales by 1/sqrt(2 d_h)
        mu, nu = F.softplus(q.float().contiguous()) * math.sqrt(2), F.softplus(k.float().contiguous())
        q = torch.cat([mu * phi.cos(), mu * phi.sin()], dim=-1).to(q.dtype)
        k = torch.cat([nu * psi.cos(), nu * psi.sin()], dim=-1).to(k.dtype)
        return q, k

    def extra_repr(self) -> str:
        return f"base={self.base}, phase_init={self.phase_init!r}"
