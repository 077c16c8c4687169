"""Per-layer hybrids: a scheme for each layer (Llama 4's iRoPE, Cohere's RNoPE-SWA, SmolLM3: RoPE layers mixed
with NoPE layers).

``layers`` names the scheme of each layer; a list shorter than the model repeats, so layer n takes
``layers[n % len(layers)]``: ``[rope, rope, rope, nope]`` is NoPE in every fourth layer at any depth of four layers or
more, ``[rope, nope]`` alternates. A pattern longer than the model is refused (its tail would build no layer, yet name
the cell: ``rope3+nope1`` on two layers would be RoPE alone); one that repeats a shorter one is that one.

Each scheme named is built once, for the layers it serves alone (``Dims(n_layer=`` its count ``)``), with its own
options (``options``: scheme -> options over its defaults, which are those of conf/posenc/<scheme>.yaml) and its own
per-layer parameters, indexed by a layer's rank among that scheme's layers; so a parameter exists only where a layer
uses it, and a scheme's parameters shared across layers (xl's u, v; t5's table) are shared among its layers.

``windows`` (scheme -> W) narrows the layers of a scheme to a sliding window: query i sees key j only where
0 <= i - j < W (itself and the W - 1 keys before it), on top of the causal and same-length masks; the other layers
see every key. RNoPE-SWA is RoPE layers with a window and NoPE layers without (conf/posenc/rnope.yaml).

Refused, with the reason, before anything is built: a scheme that acts on the input embedding (the absolute ones:
there is one input, not one per layer), a hybrid inside a hybrid, and any scheme whose ``hybrid_refused`` says why.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import AttentionInputs, Dims, PositionalScheme, Positions
from .registry import SCHEMES, build_scheme, register, scheme_class

#: the hybrid of conf/posenc/hybrid.yaml: NoPE every fourth layer, RoPE in the others (Llama 4's iRoPE)
IROPE = ["rope", "rope", "rope", "nope"]


def layer_refusal(name: str) -> str | None:
    """Why scheme ``name`` cannot take a layer of a hybrid, or None."""
    cls = scheme_class(name)
    if issubclass(cls, Hybrid):
        return "a hybrid cannot hold a hybrid; list the layers of both in one posenc.layers"
    if cls.embed is not PositionalScheme.embed:
        return f"{name} acts on the input embedding, which every layer shares, not per layer (use posenc={name} alone)"
    return cls.hybrid_refused


def random_positions_refused(options: dict, n_layer: int) -> str | None:
    """Why ``model.random_positions`` cannot serve a hybrid of these ``options`` on ``n_layer`` layers, or None: when
    no layer it builds reads a position (each layer's scheme refuses it alone, and has no window, whose mask reads
    the distance i - j), the option would change nothing."""
    layers = options.get("layers", IROPE)
    if not isinstance(layers, list) or not layers or isinstance(n_layer, bool) or not isinstance(n_layer, int):
        return None  # bad options or sizes: named by their own checks
    windows = options.get("windows") or {}
    built = list(dict.fromkeys(str(name) for name in layers[: max(n_layer, 0)]))  # the pattern repeats past it
    if not built or any(
        name not in SCHEMES or not SCHEMES[name].random_positions_refused or windows.get(name) is not None
        for name in built
    ):
        return None
    return (
        f"none of its layers reads a position (it builds {', '.join(built)} layers, without a window, each of which "
        f"refuses the option alone)"
    )


def primitive(layers: list[str]) -> list[str]:
    """The shortest pattern that repeats to ``layers`` ([rope, nope, rope, nope] -> [rope, nope]): two lists that
    build the same model from a pattern name the same cell."""
    n = len(layers)
    for p in range(1, n + 1):
        if n % p == 0 and layers == layers[:p] * (n // p):
            return layers[:p]
    return layers


def pattern_label(layers: list[str], windows: dict | None = None) -> str:
    """The scheme part of a hybrid's cell name: its pattern as runs of one scheme, ``rope3+nope1``; a windowed
    scheme's run adds ``w<W>`` (``rope3w32+nope1``)."""
    runs: list[list] = []
    for name in primitive([str(n) for n in layers]):
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    windows = windows or {}
    return "+".join(f"{n}{c}" + (f"w{windows[n]}" if windows.get(n) is not None else "") for n, c in runs)


def _problems(layers, options, windows, n_layer: int) -> str | None:
    """The first reason these options cannot build a hybrid of ``n_layer`` layers, as one line, or None."""
    if not isinstance(layers, list) or not layers or not all(isinstance(n, str) for n in layers):
        return (
            f"posenc.layers must be a non-empty list of scheme names, one per layer or a pattern that repeats over "
            f"them (e.g. [rope, rope, rope, nope]), got {layers!r}"
        )
    allowed = sorted(n for n in SCHEMES if layer_refusal(n) is None)
    for name in dict.fromkeys(layers):
        if name not in SCHEMES:
            return f"posenc.layers names unknown scheme {name!r}; a layer takes one of: {', '.join(allowed)}"
        if (why := layer_refusal(name)) is not None:
            return f"posenc.layers cannot take {name}: {why}"
    if (pattern := len(primitive(layers))) > n_layer:  # its tail would build no layer, yet name the cell
        return (
            f"posenc.layers=[{', '.join(layers)}] is a pattern of {pattern} schemes for model.n_layer={n_layer} "
            f"layers: the last {pattern - n_layer} would take no layer; list at most {n_layer} (one per layer, or a "
            f"pattern that repeats over them) or set model.n_layer >= {pattern}"
        )
    for key, mapping in (("options", options), ("windows", windows)):
        if not isinstance(mapping, dict):
            return f"posenc.{key} must be a mapping of scheme -> {key[:-1]} (or null), got {mapping!r}"
        if unused := sorted(set(mapping) - set(layers)):
            return f"posenc.{key} names {', '.join(map(str, unused))}, which no layer takes (posenc.layers={layers})"
    for name, opts in options.items():
        if not isinstance(opts, dict):
            return f"posenc.options.{name} must be a mapping of {name}'s options, got {opts!r}"
        if "drop_at_step" in opts:
            return f"posenc.options.{name}.drop_at_step: set posenc.drop_at_step on the hybrid (its layers drop at it)"
    for name, W in windows.items():
        if W is not None and (isinstance(W, bool) or not isinstance(W, int) or W < 1):
            return f"posenc.windows.{name} must be an integer >= 1 (the keys a query sees) or null, got {W!r}"
    return None


@register
class Hybrid(PositionalScheme):
    name = "hybrid"
    kind = "relative"  # every layer's scheme acts in the attention: the absolute ones are refused
    composite = True  # its parts: one scheme per group of layers
    family = "per layer"
    positions_enter = (
        "layer `n` takes `posenc.layers[n % len]`, each scheme built for its own layers; `posenc.windows`: a "
        "sliding window per scheme"
    )
    with_memory = "each layer keeps its own memory"

    def __init__(
        self,
        dims: Dims,
        *,
        layers: list[str] = IROPE,
        options: dict | None = None,
        windows: dict | None = None,
    ):
        super().__init__(dims)
        options, windows = dict(options or {}), dict(windows or {})
        if (problem := _problems(layers, options, windows, dims.n_layer)) is not None:
            raise ValueError(f"hybrid: {problem}")
        self.layers, self.windows = list(layers), windows
        names = [layers[n % len(layers)] for n in range(dims.n_layer)]  # scheme of each model layer
        self.where = [(name, names[:n].count(name)) for n, name in enumerate(names)]  # layer n -> (scheme, its rank)
        parts = {}
        for name in dict.fromkeys(names):
            try:
                own = Dims(names.count(name), dims.d_model, dims.n_head)  # built for its own layers alone
                parts[name] = build_scheme(name, own, **options.get(name, {}))
            except ValueError as e:
                raise ValueError(f"hybrid: posenc.options.{name}: {e}") from e
        self.parts = nn.ModuleDict(parts)
        self._impl = "auto"
        notes = [p.not_translation_invariant for p in parts.values() if p.not_translation_invariant]
        self.not_translation_invariant = "; ".join(notes) or None
        self.compile_refused = next((p.compile_refused for p in parts.values() if p.compile_refused), None)
        self.compile_slower = next((p.compile_slower for p in parts.values() if p.compile_slower), None)

    @property
    def attention_impl(self) -> str:
        return self._impl

    @attention_impl.setter
    def attention_impl(self, value: str) -> None:  # the model sets it once: every part takes its own path by it
        self._impl = value
        for part in self.parts.values():
            part.attention_impl = value

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """Each scheme's options sized by that scheme (rope's original_len, cope's max_position, ...), kept under
        ``options`` so that a checkpoint carries them. Options that cannot build a hybrid are left as given: the
        build names what is wrong."""
        layers, per = options.get("layers", IROPE), options.get("options") or {}
        if not isinstance(layers, list) or not isinstance(per, dict):
            return dict(options)
        sized = dict(per)
        for name in dict.fromkeys(layers):
            if name in SCHEMES and layer_refusal(name) is None and isinstance(per.get(name, {}), dict):
                if own := SCHEMES[name].sized_options(dict(per.get(name) or {}), segment_len, mem_len, max_offset):
                    sized[name] = own
        return {**options, "options": sized or options.get("options")}

    @property
    def label(self) -> str:
        return pattern_label(self.layers, self.windows)

    def at_step(self, step: int) -> None:
        for part in self.parts.values():
            part.at_step(step)

    def validate(self, segment_len: int, mem_len: int, max_offset: int = 0) -> None:
        for name, part in self.parts.items():
            try:
                part.validate(segment_len, mem_len, max_offset)
            except ValueError as e:
                raise ValueError(f"hybrid: the {name} layers: {e}") from e

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The mean over the layers of what each layer's scheme adds (the interface counts per layer)."""
        per = {name: part.extra_flops(segment_len, mem_len, batch_size) for name, part in self.parts.items()}
        return sum(per[name] for name, _ in self.where) / len(self.where)

    @classmethod
    def random_positions_problem(cls, options: dict, n_layer: int) -> str | None:
        return random_positions_refused(options, n_layer)

    def masked_positions(self, layer: int, pos: Positions) -> Positions:
        return self._layer(layer, pos)[2]  # the window stays: a mask, not an encoding

    def _layer(self, layer: int, pos: Positions) -> tuple[PositionalScheme, int, Positions]:
        """(the scheme of model layer ``layer``, the layer's rank among its layers, its positions: windowed if its
        scheme has a window)."""
        name, rank = self.where[layer]
        W = self.windows.get(name)
        if W is not None:  # 0 <= i - j < W, on top of the causal and same-length masks
            pos = Positions(pos.q, pos.k, pos.offset, pos.visible & (pos.distance < W), pos.consecutive, pos.valid)
        return self.parts[name], rank, pos

    def rotate(self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None):
        part, rank, pos = self._layer(layer, pos)
        return part.rotate(rank, q, k, pos, context)

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None):
        part, rank, pos = self._layer(layer, pos)
        return part.score_bias(rank, pos, context)

    def attend(self, a: AttentionInputs) -> Tensor:
        part, rank, pos = self._layer(a.layer, a.pos)
        return part.attend(a.but(layer=rank, pos=pos))  # SSMax: refused with windows (model.py)

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        part, rank, pos = self._layer(a.layer, a.pos)
        return part.attention_probs(a.but(layer=rank, pos=pos))

    def extra_repr(self) -> str:
        return f"layers={self.layers}" + (f", windows={self.windows}" if self.windows else "")
