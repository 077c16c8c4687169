"""Adaptive softmax (Grave et al. 2017) as the published Transformer-XL base models use it (div_val 1).

The vocabulary, sorted by frequency, is cut at c_1 < c_2 < .. < c_K into a head [0, c_1) and K tails
[c_k, c_{k+1}) (c_{K+1} = V). One output matrix W [V, D] (tied to the input embedding) and bias b [V]
score every word; each tail k also has a cluster vector C_k [D] and bias c_k:

    head:    log p(. | h) = log_softmax([h W_{[0,c_1)}^T + b_{[0,c_1)} ;  h C^T + c])    (c_1 + K entries)
    word w in the head:     log p(w | h) = head[w]
    word w in tail k:       log p(w | h) = head[c_1 + k] + log_softmax(h W_{[c_k,c_{k+1})}^T + b_{..})[w - c_k]

With d_proj = d_embed and div_val 1 (the base models) the published code has no projection matrices
("tied projections" are then nothing to tie). With no cutoffs this is the full softmax with a bias.
``torch.nn.AdaptiveLogSoftmaxWithLoss`` cannot express this: its head holds the cluster rows in one
untied weight, and its tails add a bias-free projection, so nothing can be tied to the embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AdaptiveSoftmax(nn.Module):
    """weight: [V, D] the tied output matrix (the input embedding's), or None to own one."""

    def __init__(
        self, d_model: int, vocab_size: int, cutoffs: list[int], weight: nn.Parameter | None = None, bias: bool = True
    ):
        super().__init__()
        cutoffs = [int(c) for c in cutoffs]
        if any(b <= a for a, b in zip([0, *cutoffs], [*cutoffs, vocab_size])):
            raise ValueError(
                f"adaptive softmax cutoffs must increase strictly within (0, vocab_size={vocab_size}), got {cutoffs}"
            )
        self.vocab_size, self.n_tails = vocab_size, len(cutoffs)
        self.bounds = [0, *cutoffs, vocab_size]  # cluster k covers [bounds[k], bounds[k+1])
        self.weight = weight if weight is not None else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.cluster_weight = nn.Parameter(torch.empty(self.n_tails, d_model))
        self.cluster_bias = nn.Parameter(torch.zeros(self.n_tails))
        nn.init.normal_(self.cluster_weight, std=0.02)
        if weight is None:
            nn.init.normal_(self.weight, std=0.02)

    def _scores(self, h: Tensor, cluster: int) -> Tensor:
        """h: [T, D] -> [T, size of cluster] word scores h W^T + b over one cluster's words."""
        lo, hi = self.bounds[cluster], self.bounds[cluster + 1]
        bias = None if self.bias is None else self.bias[lo:hi]
        return F.linear(h, self.weight[lo:hi], bias)

    def _head_log_probs(self, h: Tensor) -> Tensor:
        """h: [T, D] -> [T, c_1 + K]: the head words, then one entry per tail."""
        clusters = F.linear(h, self.cluster_weight, self.cluster_bias)
        return torch.log_softmax(torch.cat([self._scores(h, 0), clusters], dim=-1).float(), dim=-1)

    def token_nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """h: [.., D], targets: [..] int64 -> [..] -log p(target | h) in nats (float32). A tail's
        words are scored only for the tokens whose target lies in it."""
        shape = targets.shape
        h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        head = self._head_log_probs(h)
        shortlist = self.bounds[1]
        in_head = targets < shortlist
        logp = head.gather(1, torch.where(in_head, targets, 0)[:, None]).squeeze(1)
        for k in range(1, self.n_tails + 1):
            lo, hi = self.bounds[k], self.bounds[k + 1]
            rows = ((targets >= lo) & (targets < hi)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            tail = torch.log_softmax(self._scores(h[rows], k).float(), dim=-1)
            word = tail.gather(1, (targets[rows] - lo)[:, None]).squeeze(1)
            logp = logp.index_put((rows,), head[rows, shortlist + k - 1] + word)
        return -logp.view(shape)

    def log_probs(self, h: Tensor) -> Tensor:
        """h: [.., D] -> [.., V] log p(w | h) of every word (float32; costs a full-vocabulary pass)."""
        lead = h.shape[:-1]
        h = h.reshape(-1, h.shape[-1])
        head = self._head_log_probs(h)
        shortlist = self.bounds[1]
        parts = [head[:, :shortlist]]
        for k in range(1, self.n_tails + 1):
            tail = torch.log_softmax(self._scores(h, k).float(), dim=-1)
            parts.append(head[:, shortlist + k - 1 : shortlist + k] + tail)
        return torch.cat(parts, dim=-1).view(*lead, self.vocab_size)

    def extra_repr(self) -> str:
        return f"cutoffs={self.bounds[1:-1]}, vocab_size={self.vocab_size}, bias={self.bias is not None}"
