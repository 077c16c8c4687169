"""The held-out text the report judges on: the split, how much of it is scored, in how many documents, and how
much of it could be recited from train (verbatim overlap)."""

from __future__ import annotations

import numpy as np

from posenc_lab.data.overlap import WINDOW, shared_context

from ..dumps import TokenLosses
from ..runs import Run
from . import Section


def shared_scored(run: Run, dump: TokenLosses, split: str, window: int = WINDOW) -> np.ndarray:
    """[tokens] bool, in the order of ``TokenLosses.at``: whether each scored token's preceding ``window``
    tokens also occur in train."""
    data, _ = run.split(split)
    shared = shared_context(run.corpus().train, data, window)
    stride = (len(data) - 1) // dump.scored.shape[0]
    positions = (np.arange(dump.scored.shape[0]) * stride)[:, None] + 1 + np.arange(dump.scored.shape[1])
    return shared[positions][dump.scored]


def overlap_share(run: Run, dump: TokenLosses, split: str, window: int) -> float:
    """The share of the dump's scored tokens whose preceding ``window`` tokens also occur in train."""
    return float(shared_scored(run, dump, split, window).mean())


def section(run: Run, dump: TokenLosses, split: str, n_runs: int) -> Section:
    corpus = run.corpus()
    n_split = len(corpus.split(split))
    scored = int(dump.scored.sum())
    docs = len(np.unique(dump.token_documents))
    total_docs = int(corpus.documents(split).max()) + 1
    share32 = overlap_share(run, dump, split, WINDOW)
    share64 = overlap_share(run, dump, split, 2 * WINDOW)
    unit = "files" if corpus.document_separator is not None else "chunks of 4,096 tokens"
    text = (
        f"Corpus `{run.corpus_name}`, {split} split: {n_split:,} tokens in {total_docs} documents ({unit}). "
        f"The as-trained evaluation scores {scored:,} tokens ({scored / n_split:.0%} of the split) from "
        f"{docs} documents, the same tokens for each of the {n_runs} runs. Verbatim overlap with train: "
        f"{share32:.1%} of the scored tokens have their preceding {WINDOW} tokens somewhere in train "
        f"({share64:.1%} for {2 * WINDOW} tokens)."
        + (
            " On `pystdlib`, near-duplicate families (a package, and files sharing 10% of their 32-byte windows: "
            "the generated codec tables of `encodings/`, `posixpath`/`ntpath`, ...) lie in one split; what "
            "overlap remains at 32 bytes is the idiom of Python source (indentation, `return self.`, docstring "
            "openings): it falls below 1% at 64 bytes."
            if run.corpus_name == "pystdlib"
            else ""
        )
    )
    return Section("!Held-out text", text)
