"""Two mechanisms beside the encoding, model options that compose with every softmax scheme, with memory or without
(static memory included), and with ``model.softmax_scale=ssmax``.

**A learned attention sink** (``model.attention_sink=true``): one logit s_h per head and layer in the softmax's
denominator, the ``sinks`` of gpt-oss, the trained form of StreamingLLM's sink tokens (Xiao et al. 2024):

    p_ij = exp(z_ij) / (exp(s_h) + sum_j' exp(z_ij'))          z_ij: the scheme's whole logit (SSMax's scale in it)
    o_i  = sum_j p_ij v_j                                     the sink's share goes to no value

so a head can attend to nothing instead of piling weight on the first key. It is a key every query sees, whose
logit is s_h (not scaled by SSMax's s log n: a learned logit, not a pair's score) and whose value is zero; with
memory it stays one key however many the memory adds. s_h starts at 0 (gpt-oss draws it from N(0, 0.02)): at
initialisation, where every logit is near 0, the sink takes about 1 / (n + 1) of a row of n keys. Every softmax
scheme applies it through ``positional.base.Softmax`` (SDPA: one more key, q . 0 = 0 plus s_h in the mask; written-
out softmaxes: the log-sum-exp with s_h added); a scheme whose attention is no softmax (stick-breaking) refuses it.

**An output gate** (``model.output_gate=true``; Qiu et al. 2025, "Gated attention for large language models", their
best variant: after SDPA, elementwise, per head and channel, multiplicative, sigmoid):

    o'_i = o_i * sigmoid(x_i W_g)                             x_i: the layer's input at query i (after the pre-norm)

before the output projection; W_g [D, D], no bias, drawn as the model's other linear maps (N(0, 0.02)), so the gate
starts near 1/2 (Qwen3-Next projects it with the queries, the same map). It reads only the queries' own input, so
memory changes nothing in it; it applies to every scheme, stick-breaking included.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .softmax_scale import softmax_refusal


def attention_sink_problem(value, scheme: str, options: dict | None = None) -> str | None:
    """Why ``model.attention_sink=value`` cannot serve ``posenc=scheme`` (one line), or None."""
    if not isinstance(value, bool):
        return f"model.attention_sink must be true or false, got {value!r}"
    return softmax_refusal("model.attention_sink=true", scheme, options) if value else None


class AttentionSink(nn.Module):
    """s_h of one layer, [H]: the logit of the key no value sits on."""

    def __init__(self, n_head: int):
        super().__init__()
        self.logit = nn.Parameter(torch.zeros(n_head))

    def forward(self) -> Tensor:
        return self.logit

    def extra_repr(self) -> str:
        return f"heads={self.logit.shape[0]}"


class OutputGate(nn.Module):
    """sigmoid(x W_g) of one layer: x [B, L, D] the layer's input at the queries -> [B, L, D] the gate."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.proj(x))
