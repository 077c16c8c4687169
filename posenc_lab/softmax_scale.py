"""Scalable softmax (SSMax; Nakanishi 2025), ``model.softmax_scale=ssmax``: every attention logit of query i in
head h is multiplied by s_h log n_i before the softmax,

    a_ij = softmax_j(s_h log(n_i) z_ij)        z_ij: the scheme's whole logit (q_i . k_j / sqrt(d_h) + its bias)

where n_i is the number of keys query i sees (a row of ``Positions.visible``: memory keys included, the causal and
same-length windows and a static memory's not-yet-valid slots excluded) and s_h is learned, one per head and layer
(held by each ``Block``). The paper writes it n^{s z} / sum n^{s z}: the logits grow with log n, so that a key that
stands out keeps its weight as the keys multiply, where a plain softmax flattens.

Choices the paper leaves open: the whole logit is scaled, a scheme's additive bias (ALiBi's, T5's, FoX's) and its
position terms (xl's u, v and R terms, Shaw's a^K, CoPE's q . e) included, as SSMax is defined on the softmax's
input; scaling q . k alone would change what a bias means relative to the content as the span grows. No bias term
(the paper's variant s log n + b trained faster but generalised worse in length, and is not offered). s starts at
``SSMAX_INIT`` = 0.168 = 1 / mean_{n <= 1024} ln n, so that s log n averages 1 (the plain softmax) over the
queries of the paper's 1024-token causal context; the value Axolotl's and other public SSMax implementations
start from (the paper's text reachable here does not state its initial value: benchmarks/crosscheck_rope_scalings.py).

A scheme receives the scale as ``softmax.scale`` [H, L, 1] (``positional.base.Softmax``, the model's changes to
the softmax, a sink's logits beside it) in ``attend`` and ``attention_probs`` and applies it
without a new [L, N] tensor where its logit is linear in a per-query vector (scale q, or q + u and q + v), else
on the scores it already builds (CoPE: its gates read the unscaled logits). A scheme whose attention is no
softmax declares ``softmax_refused`` with its reason (stick-breaking), and ``ModelConfig`` refuses the
option naming it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .positional import SCHEMES, Positions

#: model.softmax_scale: null (the plain softmax) or one of these
SOFTMAX_SCALES = ("ssmax",)
SSMAX_INIT = 0.168


def softmax_refusal(option: str, scheme: str, options: dict | None = None) -> str | None:
    """Why a change to the softmax (``option``, as the user set it: ``model.softmax_scale=ssmax``,
    ``model.attention_sink=true``) cannot serve ``posenc=scheme`` with its ``options``: the scheme's (or a hybrid
    layer's) ``softmax_refused``, one line; None where it applies."""
    options = options or {}
    layers = options.get("layers") if scheme == "hybrid" and isinstance(options.get("layers"), list) else [scheme]
    for name in dict.fromkeys(layers):
        if name in SCHEMES and (refused := SCHEMES[name].softmax_refused):
            key = option.partition("=")[0]
            off = "null" if key == "model.softmax_scale" else "false"
            return f"{option} does not apply to posenc={name}: {refused} (set {key}={off})"
    return None


def softmax_scale_problem(value, scheme: str, options: dict | None = None) -> str | None:
    """Why ``model.softmax_scale=value`` cannot serve ``posenc=scheme`` with its ``options`` (one line; "; " joins
    the model's problems), or None. A hybrid is refused where one of its layers' schemes is, and with windows: n_i
    would count the model's visible keys, not the window's."""
    if value is None:
        return None
    if value not in SOFTMAX_SCALES:
        return (
            f"model.softmax_scale must be null (the plain softmax) or one of {', '.join(SOFTMAX_SCALES)}, got {value!r}"
        )
    options = options or {}
    if (refused := softmax_refusal(f"model.softmax_scale={value}", scheme, options)) is not None:
        return refused
    if scheme == "hybrid" and options.get("windows"):
        return (
            f"model.softmax_scale={value} does not apply to a hybrid with windows ({options['windows']}): log n_i "
            f"would count the model's visible keys, not the window's (set model.softmax_scale=null or no windows)"
        )
    return None


class SSMax(nn.Module):
    """s_h of one layer, [H]; called with the segment's positions it gives the logit scale s_h log n_i."""

    def __init__(self, n_head: int):
        super().__init__()
        self.s = nn.Parameter(torch.full((n_head,), SSMAX_INIT))

    def forward(self, pos: Positions) -> Tensor:
        """[H, L, 1] s_h log n_i, n_i = sum_j visible_ij (>= 1: a query always sees its own key)."""
        keys = pos.visible.sum(-1).to(torch.float32)  # n_i [L]
        return self.s[:, None, None] * keys.log()[None, :, None]

    def extra_repr(self) -> str:
        return f"heads={self.s.shape[0]}"
