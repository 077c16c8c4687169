"""NoPE: no positional signal; the causal mask alone orders the tokens."""

from .base import PositionalScheme
from .registry import register


@register
class NoPE(PositionalScheme):
    name = "nope"
    family = "none"
    positions_enter = "nowhere (causality alone)"
    with_memory = "works"
    random_positions_refused = "it reads no position: there is no positional signal to randomise"
