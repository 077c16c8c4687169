"""KERPLE, power variant (Chi et al. 2022): b_h(i, j) = -r1_h (i - j)^{r2_h}, r1 > 0, 0 < r2 <= 2.

The log variant (``kerple_log``) with another kernel; everything else (per layer and head, projection,
memory) is the same. r2 = 1 is ALiBi with a learned slope; r2 <= 2 keeps the kernel conditionally positive
definite. At d = 0 the gradient with respect to r2 is 0 (torch's pow treats 0^r2 with r2 > 0 as constant).
"""

import torch
from torch import Tensor

from .kerple_log import EPS, KerpleLog
from .registry import register


@register
class KerplePower(KerpleLog):
    name = "kerple_power"
    family = "relative bias"
    positions_enter = "`-r1 d^r2`, r1 and r2 learned per head"
    with_memory = "works"
    init = (1.0, 2.0)  # r1 ~ U(0, 1), r2 ~ U(0, 2): the authors' code
    projected = {"r1": (EPS, None), "r2": (EPS, 2.0)}

    @staticmethod
    def kernel(r1: Tensor, r2: Tensor, d: Tensor) -> Tensor:
        """-r1 d^r2, broadcast."""
        return -r1 * torch.pow(d, r2)
