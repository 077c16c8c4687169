"""NoPE: no positional signal; the causal mask alone orders the tokens."""

from .base import PositionalScheme
from .registry import register


@register
class NoPE(PositionalScheme):
    name = "nope"
