"""NoPE: no positional signal; the causal mask alone orders the tokens."""

from .base import PositionalScheme
from .registry import register


@register
class NoPE(PositionalScheme):
    name = "nope"
    random_positions_refused = "it reads no position: there is no positional signal to randomise"
