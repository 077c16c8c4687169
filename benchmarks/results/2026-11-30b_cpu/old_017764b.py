"""xl's and shaw's ``scores`` as of commit 017764b (before this session's change), for side-by-side timing:
bind one onto a scheme instance (``scheme.scores = xl_scores.__get__(scheme)``) and it runs the old code."""

import torch

from posenc_lab.positional.base import mask_to_bias
from posenc_lab.positional.xl import relative_shift


def unshifted_mask(visible, width, dtype):
    L, N = visible.shape
    flat = torch.zeros(L * width, dtype=dtype, device=visible.device)
    flat.as_strided((L, N), (width - 1, 1), L - 1).copy_(mask_to_bias(visible, dtype))
    return flat.view(L, width)


def xl_scores(self, layer, q, k, pos):
    B, H, L, d_h = q.shape
    N, W, scale = k.shape[2], k.shape[2] + 1, d_h**-0.5
    u, v = self._uv(layer)
    q = q.contiguous() * scale
    qu = (q + u.to(q.dtype) * scale).view(B * H, L, d_h)
    qv = (q + v.to(q.dtype) * scale).view(B * H, L, d_h)
    r = self.position_vectors(layer, pos, q.dtype, future=1)
    r = r.transpose(1, 2).expand(B, H, d_h, W).reshape(B * H, d_h, W)
    bd = relative_shift(torch.baddbmm(unshifted_mask(pos.visible, W, q.dtype), qv, r), N)
    return torch.baddbmm(bd, qu, k.reshape(B * H, N, d_h).transpose(1, 2)).view(B, H, L, N)


def shaw_scores(self, layer, q, k, pos):
    B, H, L, d_h = q.shape
    N, W, K, scale = k.shape[2], k.shape[2] + 1, self.K, d_h**-0.5
    d = (N - 1 - torch.arange(W, device=q.device)).clamp(0, K)
    a_key = self.a_key[layer].to(q.dtype)[K - d]
    q = q.contiguous().view(B * H, L, d_h) * scale
    qa = torch.baddbmm(unshifted_mask(pos.visible, W, q.dtype), q, a_key.T.expand(B * H, d_h, W))
    return torch.baddbmm(relative_shift(qa, N), q, k.reshape(B * H, N, d_h).transpose(1, 2)).view(B, H, L, N)


OLD = {"xl": xl_scores, "shaw": shaw_scores}
