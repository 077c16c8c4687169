"""DroPE (Gelberg, Eguchi, Akiba, Cetin 2025): train with a positional encoding, then drop it and train on.

``posenc.drop_at_step=K``, an option every scheme takes on top of its own (set it with ``+posenc.drop_at_step=K``):
the weights that have taken fewer than K optimizer steps use the scheme, those that have taken K or more use none of
its positional signal, so training continues from step K without it (the recalibration) and every evaluation of
those weights, a checkpoint's included, is of the dropped model:

    rope, xpos          no rotation (the authors' code sets cos = 1, sin = 0): q_i . k_j / sqrt(d_h), NoPE
    bias schemes        no bias (alibi, t5, kerple_*, sandwich, fire, fox's gates): plain causal softmax attention
    hybrid              each layer drops its own scheme's signal; NoPE layers and windows stay as they were

The state is read from the step, never kept: the training loop hands the scheme the global step before each step
and after it (``at_step``), and a checkpoint's ``global_step`` when it is loaded, so a run resumed on either side of
K continues exactly as one that never stopped. Nothing else changes at K: the softmax keeps its 1 / sqrt(d_h) (and
``model.softmax_scale``'s s_h log n_i, a model option, not the scheme's: rope with ssmax drops to nope with ssmax), no
QK-norm is added and no parameter is created or removed (a scheme's own parameters, t5's table say, stay in the
checkpoint and take no more gradient). The authors' code offers a QK-norm variant (``qk_norm_nope``: new RMSNorms on
q and k from the drop on) and a ``softmax_scale`` option that none of their configs sets; their main recipe,
``attention_type: nope``, is this one.

Refused, with the reason, before anything is built: a scheme with no positional signal (nope) and the schemes that
write their own attention (xl, shaw, cope, stickbreaking, path), whose attention without its positions is not
plain attention with the encoding removed but another attention.
"""

from __future__ import annotations

import functools

from torch import Tensor

from .base import AttentionInputs, PositionalScheme, Positions


def refusal(cls: type[PositionalScheme]) -> str | None:
    """Why scheme class ``cls`` cannot drop its encoding, or None (a scheme of parts, a hybrid, has its parts
    checked when built)."""
    if cls.composite:
        return None
    if cls.kind == "none":
        return "it has no positional encoding to drop"
    if cls.attend is not PositionalScheme.attend and not cls.own_attend_is_positions:
        return (
            "it writes its own attention (attend): without its positions that is another attention, not plain "
            "attention with the encoding removed"
        )
    return None


class Droppable:
    """Put before a scheme's class (``droppable``): the scheme until ``drop_at_step``, no positional signal from it."""

    drop_at_step: int
    dropped: bool = False

    def at_step(self, step: int) -> None:
        self.dropped = step >= self.drop_at_step  # a plain bool: torch.compile recompiles once, at K
        super().at_step(step)

    def embed(self, h: Tensor, pos: Positions) -> Tensor:
        return h if self.dropped else super().embed(h, pos)

    def rotate(self, layer, q, k, pos, context=None):
        return (q, k) if self.dropped else super().rotate(layer, q, k, pos, context)

    def score_bias(self, layer, pos, context=None):
        return None if self.dropped else super().score_bias(layer, pos, context)

    def _kept(self, layer: int, pos: Positions) -> Positions:
        """The positions a dropped layer attends with: its mask stays, a hybrid's window included."""
        return self.masked_positions(layer, pos)

    # softmax: the model's changes to the softmax (SSMax, a sink), model options that stay after the drop, passed on
    def attend(self, a: AttentionInputs) -> Tensor:
        if self.dropped:  # the base attention over this class's rotate and score_bias: identity and none
            return PositionalScheme.attend(self, a.but(pos=self._kept(a.layer, a.pos)))
        return super().attend(a)

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        if self.dropped:
            return PositionalScheme.attention_probs(self, a.but(pos=self._kept(a.layer, a.pos)))
        return super().attention_probs(a)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, drop_at_step={self.drop_at_step}"


@functools.cache
def droppable(cls: type[PositionalScheme]) -> type[PositionalScheme]:
    """``cls`` that drops its encoding at a step: a subclass, so its name, kind, options and state_dict keys stay."""
    return type(f"Dropped{cls.__name__}", (Droppable, cls), {"__doc__": cls.__doc__})


def check_option(name: str, value) -> None:
    """ValueError, one line, unless ``value`` is a valid ``drop_at_step`` for scheme ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}: posenc.drop_at_step must be an integer >= 1 (the training step from which the positional "
            f"encoding is dropped, DroPE) or null, got {value!r}"
        )


def drop_at(scheme: PositionalScheme, step: int) -> PositionalScheme:
    """``scheme`` made to drop its encoding from ``step`` on; ValueError naming why it cannot."""
    check_option(scheme.name, step)
    if (why := refusal(type(scheme))) is not None:
        raise ValueError(f"{scheme.name}: posenc.drop_at_step cannot apply: {why}")
    if scheme.composite:  # a hybrid: each part with a signal must drop it
        signal = {n: p for n, p in scheme.parts.items() if p.kind != "none"}
        if not signal:
            raise ValueError(
                f"{scheme.name}: posenc.drop_at_step cannot apply: no layer has a positional encoding to drop"
            )
        for name, part in signal.items():
            if (why := refusal(type(part))) is not None:
                raise ValueError(f"{scheme.name}: posenc.drop_at_step cannot apply to its {name} layers: {why}")
    scheme.__class__ = droppable(type(scheme))  # same module, same parameters: only the methods above change
    scheme.drop_at_step, scheme.dropped = step, False
    return scheme
