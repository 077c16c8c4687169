"""Forgetting attention (FoX; Lin et al., ICLR 2025): a data-dependent forget gate per head decays the scores.

Per layer and head h, a scalar gate from each token's layer input x_t (the model's normalised
[memory ; segment] states, the ones k and v are projected from):

    f_t       = sigmoid(w_h . x_t + b_h)                     in (0, 1)
    F_t       = sum_{l <= t} log f_l                          cumulative, over the N keys, memory first
    D_ij      = sum_{l = j+1..i} log f_l = F_i - F_j          <= 0, and 0 on the diagonal
    scores_ij = q_i . k_j / sqrt(d_h) + D_ij

FoX uses no other position signal: the order enters only through which gates lie between the two tokens. A
query forgets a key at the rate its gates say, so a gate near 1 carries a key through any number of tokens and
a gate near 0 cuts everything before it.

With memory the gates of memory positions come from the memory's own hidden states, which it holds as each
layer's input (the gate of the oldest memory key is never used: no pair has it between its tokens), so a
segment with memory scores exactly as the same tokens at the end of one long run, and an episode reset (no
memory) starts the sums afresh. The same-length window and episode resets only change which keys are visible.

Choices the paper leaves open, from the authors' code (``ForgettingAttentionLayer``, ``fgate_type="full"``): the
gate is a linear map of the layer input with a bias, one output per head, per layer; its weight starts as every
linear map's (N(0, 0.02)) and its bias at 0, so f starts near 1/2 (the decay-time initialisation of the paper is
for its data-independent gates only); log f is computed in fp32 (``logsigmoid``), and so is F, of which only
differences are used. The paper's "Pro" block (output gate, QK-norm, key and value shifts) is architecture, not
position, and is not offered. The fused path (flex_attention, CUDA) reads two entries of F per pair and takes
their gradient; elsewhere the [B, H, L, N] bias goes to SDPA.
"""

import torch.nn.functional as F
from torch import Tensor, nn

from .base import CumulativeBias, Dims, PositionalScheme, Positions
from .registry import register


@register
class FoX(PositionalScheme):
    name = "fox"
    kind = "relative"
    family = "data-dependent bias"
    positions_enter = "`sum_{l=j+1..i} log f_l`, forget gates `f_t = sigmoid(w . x_t + b)` from the layer input"
    with_memory = "gates of memory from its own states"
    # not measured on a GPU: a learned bias of every pair, whose gradient SDPA cannot give (as t5's: fused from 0)
    fused_from_keys = 0
    random_positions_refused = (
        "it reads no position: the order enters only through the forget gates of the tokens between query and key"
    )
    not_translation_invariant = (
        "a pair's decay is the sum of the log forget gates of the tokens between its two tokens: it depends on what "
        "lies between them, not on i - j alone"
    )

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.gate = nn.ModuleList(nn.Linear(dims.d_model, dims.n_head) for _ in range(dims.n_layer))  # w_h, b_h

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The gate projection of every key, memory included (recomputed each segment): 2 N D H."""
        return 2 * (segment_len + mem_len) * self.dims.d_model * self.dims.n_head

    def log_gates(self, layer: int, context: Tensor) -> Tensor:
        """context: [B, N, D] -> [B, H, N] log f_t, fp32."""
        return F.logsigmoid(self.gate[layer](context).float()).transpose(1, 2)

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> CumulativeBias:
        if context is None:
            raise ValueError("fox: the forget gates come from the layer's input; attend needs context=[B, N, D]")
        log_gates = self.log_gates(layer, context)
        if pos.valid is not None:  # a static memory's empty slots: no gate, so F over the keys that exist
            log_gates = log_gates.masked_fill(~pos.valid, 0.0)
        return CumulativeBias(log_gates.cumsum(-1))  # F_t; D_ij = F_i - F_j
