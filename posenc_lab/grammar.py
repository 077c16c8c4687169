"""What Hydra's override grammar cannot read, said as the project's one line: a bare word (``rope``: did you mean
posenc=rope?), a key it cannot read (``model.mém_len``: the valid keys, the nearest first), a bracket or quote left
open (the closed form), else Hydra's own reason and the forms an override takes. A value that only needs quotes is
``compose.unquoted``'s. Every function takes a ``compose.Composer`` (Hydra initialised on the command's config)."""

from __future__ import annotations

import contextlib
import difflib
import io
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .errors import bounded, shown


def without_flags(argv: Sequence[str]) -> list[str]:
    """The overrides of a Hydra app's command line, its flags (``--cfg job``, ``-m``) and their values left out, by
    the argument parser ``hydra.main`` itself uses (which flag takes a value is Hydra's to say)."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return list(get_args_parser().parse_known_args(list(argv))[0].overrides)
    except SystemExit:  # a flag Hydra refuses: its own message follows when Hydra parses the line
        return []


_FORMS = "KEY=VALUE, GROUP=OPTION, +KEY=VALUE, ++KEY=VALUE or ~KEY"
_CLOSERS = {"[": "]", "{": "}", "(": ")"}


def problem(composer: Any, override: str, overrides: Sequence[str], command: str) -> str:
    """Why Hydra's grammar cannot read ``override`` (one of the command line's ``overrides``), in one line naming it
    and the nearest valid form (the module's docstring); ``command``: the command's name, for a top-level key."""
    text = shown(override, quote=False)
    key, sep, value = override.partition("=")
    if not sep and not override.startswith("~"):
        return f"{text} is not an override ({_FORMS}); {_bare_word(composer, override, overrides)}"
    name = key.lstrip("+~")
    if sep and name and not reads(composer, f"{name}=1"):
        return f"{text}: Hydra cannot read the key {shown(name)}; {_nearest_keys(composer, name, overrides, command)}"
    if fixed := _closed(composer, override):
        return f"{text}: a bracket or quote is not closed; did you mean {shown(fixed, quote=False)}?"
    try:
        composer.parse(override)
        reason = ""
    except Exception as e:  # noqa: BLE001 - the grammar's reason, its first line
        reason = " ".join(str(e).split("See https://")[0].split())
    return f"{text} is not an override Hydra's grammar reads ({bounded(reason)}); an override is {_FORMS}"


def reads(composer: Any, override: str) -> bool:
    """Whether Hydra's grammar reads ``override``."""
    try:
        composer.parse(override)
        return True
    except Exception:  # noqa: BLE001 - the grammar's error
        return False


def _nearest(word: str, candidates: Sequence[str]) -> list[str]:
    """``candidates``, the nearest to ``word`` first (difflib's ratio; ties in their order)."""
    return sorted(candidates, key=lambda c: -difflib.SequenceMatcher(None, word.lower(), c.lower()).ratio())


def _group_choices(composer: Any, overrides: Sequence[str]) -> list[str]:
    """The group overrides among ``overrides`` that read and name an option (``model=tiny``): the config they
    compose is the one the command line's keys are looked up in."""
    out = []
    for o in overrides:
        if reads(composer, o) and composer.is_group(p := composer.parse(o)):
            if p.value() in composer.group_options(p.key_or_group):
                out.append(o)
    return out


def _bare_word(composer: Any, word: str, overrides: Sequence[str]) -> str:
    """What a word without ``=`` most likely meant: an option of a group (``posenc=rope``), a key given no value,
    else the nearest option or key."""
    groups = composer.top_groups()
    meant = [f"{g}={word}" for g in groups if word in composer.group_options(g)]
    if meant:
        return f"did you mean {' or '.join(meant)}?"
    if word in groups:
        return f"a group takes an option: {word}=OPTION, one of {', '.join(composer.group_options(word))}"
    try:
        cfg = composer.groups_config(_group_choices(composer, overrides))
        if OmegaConf.select(cfg, word, default=None, throw_on_missing=False) is not None or "." in word:
            return f"a key takes a value: {word}=VALUE"
    except Exception:  # noqa: BLE001 - a word that is no key path
        pass
    options = [f"{g}={o}" for g in groups for o in composer.group_options(g)]
    close = difflib.get_close_matches(word, [o.split("=", 1)[1] for o in options], n=3, cutoff=0.6)
    near = [o for o in options if o.split("=", 1)[1] in close]
    return f"did you mean {' or '.join(near[:3])}?" if near else f"the groups are: {', '.join(groups)}"


def _nearest_keys(composer: Any, key: str, overrides: Sequence[str], command: str) -> str:
    """The valid keys where ``key`` (one Hydra cannot read) points, the nearest first."""
    try:
        cfg = composer.groups_config(_group_choices(composer, overrides))
    except Exception:  # noqa: BLE001 - the group choices Hydra refuses: the command's own config
        cfg = composer.groups_config([])
    parts, node, depth = key.split("."), cfg, 0
    while depth < len(parts) - 1 and isinstance(node, DictConfig) and parts[depth] in node.keys():
        node, depth = node._get_node(parts[depth]), depth + 1
    where = ".".join(parts[:depth]) or f"`posenc-lab {command}`"
    valid = [k for k in node.keys() if k != "hydra" and not k.startswith("_")] if isinstance(node, DictConfig) else []
    bad = parts[depth]
    nearest = ", ".join(_nearest(bad, [str(k) for k in valid]))
    return f"{shown(bad)} is not a key of {where}; the keys are, the nearest first: {nearest}"


def _closed(composer: Any, override: str) -> str | None:
    """``override`` with its open brackets and quotes closed (or a stray closing one dropped), if Hydra then reads
    it; else None."""
    open_, quote_ = [], None
    for c in override.partition("=")[2]:
        if quote_:
            quote_ = None if c == quote_ else quote_
        elif c in "'\"":
            quote_ = c
        elif c in _CLOSERS:
            open_.append(c)
        elif c in _CLOSERS.values() and open_ and _CLOSERS[open_[-1]] == c:
            open_.pop()
    candidates = [override + (quote_ or "") + "".join(_CLOSERS[c] for c in reversed(open_))]
    candidates += [override[:i] + override[i + 1 :] for i, c in enumerate(override) if c in _CLOSERS.values()]
    return next((c for c in candidates if c != override and reads(composer, c)), None)
