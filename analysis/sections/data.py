"""The held-out text the report judges on: the split, how much of it is scored, in how many documents, and how
much of it could be recited from train (verbatim overlap). Its measurement, ``shared`` (which scored tokens could
be recited), is what the verdicts section judges again without."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posenc_lab.data.overlap import WINDOW, shared_context

from ..dumps import TokenLosses
from ..runs import Run
from .base import REPORT, Part, Section, register


def shared_scored(run: Run, dump: TokenLosses, split: str, window: int = WINDOW) -> np.ndarray:
    """[tokens] bool, in the order of ``TokenLosses.at``: whether each scored token's preceding ``window``
    tokens also occur in train."""
    data, _ = run.split(split)
    shared = shared_context(run.corpus().train, data, window)
    stride = (len(data) - 1) // dump.scored.shape[0]
    positions = (np.arange(dump.scored.shape[0]) * stride)[:, None] + 1 + np.arange(dump.scored.shape[1])
    return shared[positions][dump.scored]


@dataclass
class HeldOut:
    run: Run  # the first run of the judged corpus
    dump: TokenLosses  # its as-trained dump
    n_runs: int
    shared: np.ndarray  # [tokens] bool: the scored token's preceding WINDOW tokens occur in train
    shared_long: np.ndarray  # the same for 2 WINDOW tokens


@register
class Data(Section):
    name = "data"
    title = "Held-out text"
    scope = REPORT
    numbered = False

    def measure(self, ctx) -> HeldOut | None:
        group = ctx.report.main
        if group is None:
            return None
        run, split = group.runs[0], ctx.shared.split
        dump = group.trained[run.name]
        return HeldOut(
            run,
            dump,
            len(group.runs),
            shared_scored(run, dump, split, WINDOW),
            shared_scored(run, dump, split, 2 * WINDOW),
        )

    def render(self, ctx, m: HeldOut | None) -> Part | None:
        if m is None:
            return None
        split, run = ctx.shared.split, m.run
        corpus = run.corpus()
        n_split = len(corpus.split(split))
        scored = int(m.dump.scored.sum())
        docs = len(np.unique(m.dump.token_documents))
        units = np.bincount(np.unique(m.dump.token_units, return_inverse=True)[1])
        unit_kind = corpus.units_name(split)
        total_docs = int(corpus.documents(split).max()) + 1
        unit = "files" if corpus.document_separator is not None else "chunks of 4,096 tokens"
        text = (
            f"Corpus `{run.corpus_name}`, {split} split: {n_split:,} tokens in {total_docs} documents ({unit}). "
            f"The as-trained evaluation scores {scored:,} tokens ({scored / n_split:.0%} of the split) from "
            f"{docs} documents, the same tokens for each of the {m.n_runs} runs. They fall in {len(units)} "
            f"{unit_kind}, "
            "the independent units of every interval of the report, the largest holding "
            f"{units.max() / units.sum():.1%} "
            f"of them (a unit that holds most of the text makes the intervals wide). Verbatim overlap with train: "
            f"{float(m.shared.mean()):.1%} of the scored tokens have their preceding {WINDOW} tokens somewhere in "
            f"train ({float(m.shared_long.mean()):.1%} for {2 * WINDOW} tokens)."
            + (
                " On `pystdlib`, near-duplicate families (a package, and files sharing 10% of their 32-byte windows: "
                "the generated codec tables of `encodings/`, `posixpath`/`ntpath`, ...) lie in one split; what "
                "overlap remains at 32 bytes is the idiom of Python source (indentation, `return self.`, docstring "
                "openings): it falls below 1% at 64 bytes."
                if run.corpus_name == "pystdlib"
                else ""
            )
        )
        return Part(text)
