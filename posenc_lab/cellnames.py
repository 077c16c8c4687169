"""The one naming rule for cells: one formatter (``str(CellName)``) and one parser (``CellPattern.parse``) for run
tables, the report, ``conf/paper.yaml``, ``ablate.extra_seed_cells``, plans, ``compare`` and the names of wandb runs
(``tracking.py``). It lives in posenc_lab so that training names its runs by it too; ablate's plan and the analysis
import it from here.

A *cell* is the runs equal but for their seed. Its name::

    [<group>/]<scheme>:(mem<M>|nomem|win<W>)[:half|:recent<f>]

``xl:mem32`` (xl with memory 32), ``xl:nomem``, ``xl:win64`` (xl without memory trained at segment W = 64 where the
grid's other cells train at L, a window of the same span as L + M: its run carries ``window_cell: true``,
``WINDOW_KEY``), ``xl:mem32:half`` (the recent-half loss,
``model.loss_recent_frac=0.5``), ``xl:mem32:recent0.3`` (any other fraction), ``recall/xl:mem16`` (a cell of
the recall probe; a corpus name stands there when a report holds several language corpora), ``rope3+nope1:mem32``
(a per-layer hybrid, by its pattern), ``rope+drop@800:mem32`` (rope dropped at step 800, DroPE), ``rope+ssmax:mem32``
(rope with ``model.softmax_scale=ssmax``), ``rope+sink:mem32``, ``rope+gate:mem32``, ``nope+abacus:nomem`` and
``nope+coupling:nomem`` (``model.attention_sink``, ``model.output_gate``, ``model.data_positions``: ``MARKS``).
A *pattern* names cells the same way, with parts left open::

    <scheme> may be a kind of the registry (absolute, relative, none) or *        any scheme of that kind
    mem (no length)                                                                 any memory length
    win (no length)                                                                 any window cell
    the memory part left out (``xl``, ``*``, ``absolute``)                          with or without memory
    the loss part left out                                                          the full loss only
    :*                                                                              any loss

so ``xl:mem`` is xl with any memory length and the full loss, ``*:mem`` every cell with memory, ``absolute:mem:half``
every absolute scheme with memory and the recent-half loss. A window cell is matched only by a pattern that names
``win`` (as a recent-loss cell only by one that names its loss): ``*`` and ``xl:nomem`` leave ``xl:win64`` out. A
name is a pattern that matches one cell.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .positional import SCHEMES, schemes_of_kind
from .positional.hybrid import IROPE, Hybrid, pattern_label

ANY = "*"
GRAMMAR = "[<group>/]<scheme>[:mem<M>|:mem|:nomem|:win<W>|:win][:half|:recent<f>|:*]"
WINDOW_KEY = "window_cell"  # conf/train.yaml's key: true for a window cell (trained without memory at W)
_MEMORY = re.compile(r"mem(\d+)?|nomem")
_WINDOW = re.compile(r"win(\d+)?")
_LOSS = re.compile(r"half|recent(\d*\.?\d+(?:e-?\d+)?)")


def loss_label(frac: float) -> str:
    """The training loss of a cell: 'full', 'half' (the paper's recent half) or 'recent0.3'."""
    frac = float(frac)
    return "full" if frac >= 1.0 else "half" if frac == 0.5 else f"recent{frac!r}"


#: The model options that make a cell of their own, in the order a label shows them: the mark of each, the value
#: that sets it, and what the entry ``S+<mark>`` of ``ablate.*.schemes`` overrides.
MARKS = {
    "ssmax": ("softmax_scale", "ssmax", "model.softmax_scale=ssmax"),
    "sink": ("attention_sink", True, "model.attention_sink=true"),
    "gate": ("output_gate", True, "model.output_gate=true"),
    "abacus": ("data_positions", "abacus", "model.data_positions=abacus"),
    "coupling": ("data_positions", "coupling", "model.data_positions=coupling"),
}


def model_marks(model: Mapping | None) -> list[str]:
    """The marks (``MARKS``) of a run's model options (``model``: the ``model`` node, or any mapping of its keys)."""
    model = model or {}
    return [mark for mark, (key, on, _) in MARKS.items() if model.get(key) == on]


def scheme_label(
    scheme: str, random_positions: int | None = None, posenc: dict | None = None, model: Mapping | None = None
) -> str:
    """The scheme part of a cell's name: the scheme; a per-layer hybrid by its pattern (``rope3+nope1``,
    ``positional.hybrid.pattern_label``); ``+ssmax``, ``+sink``, ``+gate`` where the model trains with scalable
    softmax, a learned attention sink, an output gate (``MARKS``, read from ``model``, the run's model options);
    ``+drop@K`` where it drops its encoding at step K (DroPE); ``+rand<P>`` where it trains with
    ``model.random_positions=P`` (Ruoss et al. 2023), so that each is a cell of its own, in that order
    (``rope3+nope1+ssmax+sink+drop@50+rand64``). posenc: the run's ``posenc`` node (its ``name`` wins over
    ``scheme``, a preset's file name such as ``irope``)."""
    posenc = posenc or {}
    scheme = str(posenc.get("name", scheme))
    label = pattern_label(posenc.get("layers", IROPE), posenc.get("windows")) if scheme == Hybrid.name else scheme
    for mark in model_marks(model):
        label += f"+{mark}"
    if posenc.get("drop_at_step") is not None:
        label += f"+drop@{posenc['drop_at_step']}"
    return label if random_positions is None else f"{label}+rand{random_positions}"


@dataclass(frozen=True)
class CellName:
    """One cell: ``mem_len`` 0 without memory; ``loss_frac`` of ``model.loss_recent_frac``; ``group`` '' for the
    main language corpus; ``window`` W > 0 for a window cell (no memory, trained at segment W), else 0."""

    scheme: str
    mem_len: int = 0
    loss_frac: float = 1.0
    group: str = ""
    window: int = 0

    @property
    def memory(self) -> bool:
        return self.mem_len > 0

    @property
    def loss(self) -> str:
        return loss_label(self.loss_frac)

    def __str__(self) -> str:
        memory = f"mem{self.mem_len}" if self.mem_len else f"win{self.window}" if self.window else "nomem"
        return (
            (f"{self.group}/" if self.group else "")
            + f"{self.scheme}:{memory}"
            + ("" if self.loss == "full" else f":{self.loss}")
        )

    @classmethod
    def parse(cls, text: str, where: str = "a cell name") -> CellName:
        """The cell ``text`` names (``xl:mem32``); ValueError unless it names exactly one."""
        p = CellPattern.parse(text, where)
        several = p.memory is None or (p.memory and p.mem_len is None) or p.window is None
        if p.scheme == ANY or p.scheme in _kinds() or several:
            raise ValueError(
                f"{where}: {text!r} names several cells; a cell is {GRAMMAR} with a scheme and mem<M>, nomem or win<W>"
            )
        if p.loss_frac is None:
            raise ValueError(f"{where}: {text!r} names several cells (':*' is any loss)")
        return cls(p.scheme, p.mem_len or 0, p.loss_frac, p.group, p.window)


class HasCell:
    """The cell of anything with ``scheme``, ``mem_len``, ``loss_frac``, ``group`` (None or '' for the main
    corpus) and ``seed`` (None if unknown): a run as the analysis reads it (``analysis.runs.Run``), a run an
    ablation plans (``ablate.plan.RunSpec``). The one place that builds a cell's name from run settings."""

    scheme: str
    mem_len: int
    loss_frac: float
    group: str | None
    seed: int | None
    random_positions: int | None  # +model.random_positions=P: the cell <scheme>+rand<P> (``scheme_label``)
    posenc: dict | None  # the posenc node: a hybrid's layers, DroPE's step (``scheme_label``); None: the scheme alone
    model_options: dict | None  # the model options that name a cell (``MARKS``): <scheme>+ssmax, +sink, +gate
    window: int  # W > 0: a window cell (no memory, trained at segment W, ``WINDOW_KEY``), the cell <scheme>:win<W>

    @property
    def cell_name(self) -> CellName:
        label = scheme_label(self.scheme, self.random_positions, self.posenc, self.model_options)
        return CellName(label, self.mem_len, self.loss_frac, self.group or "", 0 if self.mem_len else self.window)

    @property
    def cell(self) -> str:
        return str(self.cell_name)

    @property
    def label(self) -> str:
        """e.g. 'xl:mem32, seed 0' (unique within an ablation)."""
        return self.cell + ("" if self.seed is None else f", seed {self.seed}")


@dataclass(frozen=True)
class CellPattern:
    """Cells by name with parts left open (module docstring): ``scheme`` a scheme, a kind or ``*``; ``memory``
    None for with or without; ``mem_len`` None for any length; ``loss_frac`` None for any loss; ``window`` None
    for any window cell, 0 for none (the default: a pattern that does not name ``win`` leaves window cells out)."""

    scheme: str
    memory: bool | None = None
    mem_len: int | None = None
    loss_frac: float | None = 1.0
    group: str = ""
    window: int | None = 0

    @classmethod
    def parse(cls, text: str, where: str = "a cell") -> CellPattern:
        """The pattern of ``text``; ValueError naming the grammar if it is not one."""
        group, _, rest = str(text).strip().rpartition("/")
        scheme, *parts = rest.split(":")
        bad = ValueError(
            f"{where}: {text!r} is not a cell ({GRAMMAR}; for a scheme S: S:mem32, S:nomem, S:mem:half, recall/S:mem)"
        )
        if not scheme or len(parts) > 2 or (group and not group.strip()):
            raise bad
        memory, mem_len, loss_frac, window = None, None, 1.0, 0
        if parts and (w := _WINDOW.fullmatch(parts[0])) is not None:
            memory, mem_len, window = False, 0, int(w.group(1)) if w.group(1) else None
            if window == 0:
                raise bad
        elif parts:
            m = _MEMORY.fullmatch(parts[0])
            if m is None:
                raise bad
            memory = parts[0] != "nomem"
            mem_len = int(m.group(1)) if m.group(1) else (0 if not memory else None)
            if memory and mem_len == 0:
                raise bad
        if len(parts) == 2:
            if parts[1] == ANY:
                loss_frac = None
            elif (m := _LOSS.fullmatch(parts[1])) is None:
                raise bad
            else:
                loss_frac = 0.5 if parts[1] == "half" else float(m.group(1))
                if not 0 < loss_frac < 1:
                    raise ValueError(f"{where}: {text!r}: a recent-loss fraction is in (0, 1), got {loss_frac:g}")
        return cls(scheme, memory, mem_len, loss_frac, group, window)

    def matches(self, cell: CellName) -> bool:
        if self.group != cell.group:
            return False
        if self.scheme != ANY:
            kinds = _kinds()
            if self.scheme in kinds and self.scheme not in SCHEMES:
                if cell.scheme not in schemes_of_kind(self.scheme):
                    return False
            elif self.scheme != cell.scheme:
                return False
        if self.memory is not None and self.memory != cell.memory:
            return False
        if self.mem_len is not None and self.mem_len != cell.mem_len:
            return False
        if (self.window is None and not cell.window) or (self.window is not None and self.window != cell.window):
            return False
        return self.loss_frac is None or math.isclose(self.loss_frac, cell.loss_frac, rel_tol=1e-9)

    def __str__(self) -> str:
        memory = "" if self.memory is None else ":nomem" if not self.memory else f":mem{self.mem_len or ''}"
        if self.window != 0:
            memory = f":win{self.window or ''}"
        loss = ":*" if self.loss_frac is None else "" if self.loss_frac >= 1 else f":{loss_label(self.loss_frac)}"
        return (f"{self.group}/" if self.group else "") + self.scheme + memory + loss


def _kinds() -> set[str]:
    """The scheme kinds of the registry (a pattern may name one: ``absolute``)."""
    return {cls.kind for cls in SCHEMES.values()}
