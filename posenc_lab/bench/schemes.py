"""The schemes a benchmark times (``--schemes``): each a scheme name, or a name with options in brackets::

    sinusoid,pope,wall,rope[scaling=dynamic;original_len=128;factor=4],sinusoid[softmax_scale=ssmax]

Options are ``key=value`` separated by ``;``: the scheme's own (the keys of ``conf/posenc/<name>.yaml``, over whose
values they go, checked by type as training checks them: ``registry.option_problem``) and the model's
``softmax_scale``, ``attention_sink`` and ``output_gate`` (``rope[attention_sink=true]``). A value is read as YAML:
``[1.0,2.0]`` a list, ``{rope: 32}`` a mapping, ``null``.

Each point's label (the ``scheme`` column of bench.csv and bench.md, and what ``--ratio-to`` names) follows the cell
names of the report (``cellnames.scheme_label``): a hybrid by its pattern (``rope3+nope1``), ``+ssmax`` for scalable
softmax; the scheme's other options in brackets as given, a list of more than four values shortened
(``rope[scaling=longrope;long_factor=[1,1.13,...](32)]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from ..cellnames import model_marks, scheme_label
from ..positional import scheme_options
from ..positional.registry import option_problem
from ..sink_gate import attention_sink_problem
from ..softmax_scale import softmax_scale_problem

#: the model options a scheme entry may carry beside its own
MODEL_OPTIONS = ("softmax_scale", "attention_sink", "output_gate")
_PATTERN = ("layers", "windows")  # a hybrid's options its label shows as its pattern
_CLOSE = {"[": "]", "{": "}"}


def split_top(text: str, sep: str, what: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets and braces (empty parts dropped); ValueError on unbalanced ones."""
    parts, depth, start = [], [], 0
    for i, ch in enumerate(text):
        if ch in _CLOSE:
            depth.append(_CLOSE[ch])
        elif ch in _CLOSE.values():
            if not depth or depth.pop() != ch:
                raise ValueError(f"{what}: {text!r} closes a bracket it did not open (at {text[: i + 1]!r})")
        elif ch == sep and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{what}: {text!r} leaves a bracket open (it needs {''.join(reversed(depth))!r})")
    return [p.strip() for p in [*parts, text[start:]] if p.strip()]


def _shown(text: str) -> str:
    """An option's value as its label shows it: as given, a list of more than four values shortened."""
    value = yaml.safe_load(text)
    if isinstance(value, list) and len(value) > 4:
        return "[" + ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value[:2]) + f",...]({len(value)})"
    return text


@dataclass(frozen=True)
class SchemeSpec:
    """A scheme as the benchmark times it: ``options`` over its conf/posenc yaml, ``model`` fields
    (``MODEL_OPTIONS``), and the options' text as given (``given``: key -> value text), for the label."""

    scheme: str
    options: dict = field(default_factory=dict, hash=False)
    model: dict = field(default_factory=dict, hash=False)
    given: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        node = {"name": self.scheme, **{k: v for k, v in self.options.items() if k in _PATTERN}}
        rest = [f"{k}={_shown(v)}" for k, v in self.given if k not in _PATTERN and k not in MODEL_OPTIONS]
        return (
            scheme_label(self.scheme, None, node)
            + (f"[{';'.join(rest)}]" if rest else "")
            + "".join(f"+{mark}" for mark in model_marks(self.model))
        )

    @property
    def text(self) -> str:
        """The entry as ``--schemes`` takes it."""
        return self.scheme + (f"[{';'.join(f'{k}={v}' for k, v in self.given)}]" if self.given else "")

    def problem(self) -> str | None:
        """Why these options cannot serve the scheme (an unknown key, a value of another type), naming the valid
        keys; None if they can (what only building the scheme can tell is asked of it: ``cli.option_problems``)."""
        valid = [*scheme_options(self.scheme), *MODEL_OPTIONS]
        for key, _ in self.given:
            if key not in valid:
                return f"--schemes {self.text}: {self.scheme} has no option {key!r}; its options: {', '.join(valid)}"
        for key, value in self.options.items():
            if (problem := option_problem(self.scheme, key, value)) is not None:
                return f"--schemes {self.text}: {problem}"
        if (problem := softmax_scale_problem(self.model.get("softmax_scale"), self.scheme, self.options)) is not None:
            return f"--schemes {self.text}: {problem}"
        if problem := attention_sink_problem(self.model.get("attention_sink", False), self.scheme, self.options):
            return f"--schemes {self.text}: {problem}"
        return None


def parse_entry(text: str) -> SchemeSpec:
    """One entry of ``--schemes`` (``rope[scaling=dynamic;factor=4]``); ValueError (one line) if it is no entry."""
    what = "--schemes"
    name, bracket, rest = text.partition("[")
    name = name.strip()
    if not name or (bracket and not rest.endswith("]")):
        raise ValueError(f"{what}: {text!r} is not NAME or NAME[key=value;...] (e.g. rope[scaling=dynamic;factor=4])")
    options, model, given = {}, {}, []
    for item in split_top(rest[:-1], ";", what) if bracket else []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or key in dict(given):
            raise ValueError(f"{what}: {text!r}: expected key=value once per key, got {item!r}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ValueError(f"{what}: {text!r}: the value of {key} is not YAML: {value!r}") from None
        (model if key in MODEL_OPTIONS else options)[key] = parsed
        given.append((key, value.strip()))
    return SchemeSpec(name, options, model, tuple(given))


def parse_schemes(text: str, all_names: tuple[str, ...]) -> list[SchemeSpec]:
    """The entries of ``--schemes`` ('all': every registered scheme with its yaml's options)."""
    if text.strip() == "all":
        return [SchemeSpec(name) for name in all_names]
    return [parse_entry(entry) for entry in split_top(text, ",", "--schemes")]


def as_spec(scheme: str | SchemeSpec) -> SchemeSpec:
    return scheme if isinstance(scheme, SchemeSpec) else SchemeSpec(scheme)
