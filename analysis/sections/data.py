"""The held-out text the report judges on: the split, how much of it is scored, in how many documents, and how
much of it could be recited from train (verbatim overlap), and what reference compressors need for it
(``compressors``: zlib, lzma, a byte n-gram model; on byte-level corpora, kept per corpus identity). Its
measurement, ``shared`` (which scored tokens could be recited), is what the verdicts section judges again without."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from posenc_lab.data.overlap import WINDOW, shared_context
from posenc_lab.io import CorruptFileError, read_json, write_json
from posenc_lab.rundir import corpus_identity

from ..compressors import Compressed, compress
from ..dumps import TokenLosses, stack
from ..runs import Run
from .base import REPORT, Part, Section, Table, register


def shared_scored(run: Run, dump: TokenLosses, split: str, window: int = WINDOW) -> np.ndarray:
    """[tokens] bool, in the order of ``TokenLosses.at``: whether each scored token's preceding ``window``
    tokens also occur in train."""
    data, _ = run.split(split)
    shared = shared_context(run.corpus().train, data, window)
    stride = (len(data) - 1) // dump.scored.shape[0]
    positions = (np.arange(dump.scored.shape[0]) * stride)[:, None] + 1 + np.arange(dump.scored.shape[1])
    return shared[positions][dump.scored]


def compressed(run: Run, split: str, folder: Path, log=print) -> Compressed | None:
    """The reference compressors' figures of ``split`` of the run's corpus (None unless it is byte-level), kept in
    ``folder/<corpus sha256>_<split>.json``: the n-gram model reads the whole train split (seconds per MB)."""
    corpus = run.corpus()
    if corpus.unit != "byte":
        return None
    path = folder / f"{corpus_identity(corpus)['sha256'][:16]}_{split}.json"
    if path.is_file():
        try:
            return Compressed(**read_json(path))
        except (CorruptFileError, TypeError) as e:
            log(f"  {path} cannot be read ({e}); computing it again")
    log(f"  reference compressors ({split} split of {run.corpus_name})")
    figures = compress(corpus.train, corpus.split(split), corpus.vocab_size)
    write_json(path, figures.as_dict())
    return figures


def compressor_table(c: Compressed, models: dict[str, float], scale_name: str) -> pd.DataFrame:
    """A row per reference compressor and per cell (its as-trained figure, mean over seeds), lowest first."""
    rows = [
        {"method": "zlib level 9 (32 KB window)", "text": "whole split", scale_name: c.zlib},
        {"method": "lzma preset 9 (xz)", "text": "whole split", scale_name: c.lzma},
        {
            "method": f"byte n-gram, order {c.order} (Witten-Bell, fitted on train)",
            "text": "whole split",
            scale_name: c.ngram,
        },
    ]
    rows += [
        {"method": f"model {cell}, as trained", "text": "scored tokens", scale_name: v} for cell, v in models.items()
    ]
    return pd.DataFrame(rows).sort_values(scale_name, kind="stable").reset_index(drop=True)


@dataclass
class HeldOut:
    run: Run  # the first run of the judged corpus
    dump: TokenLosses  # its as-trained dump
    n_runs: int
    shared: np.ndarray  # [tokens] bool: the scored token's preceding WINDOW tokens occur in train
    shared_long: np.ndarray  # the same for 2 WINDOW tokens
    compressed: Compressed | None  # the reference compressors (byte-level corpora)
    models: dict[str, float]  # cell -> its as-trained figure (mean over seeds, the corpus's unit: bpb, ...)


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
        models = {
            cell: float(stack([group.trained[r.name] for r in runs]).mean() * group.scale)
            for cell, runs in group.cells.items()
        }
        return HeldOut(
            run,
            dump,
            len(group.runs),
            shared_scored(run, dump, split, WINDOW),
            shared_scored(run, dump, split, 2 * WINDOW),
            compressed(run, split, ctx.report.out / "dumps" / "compressors", ctx.log),
            models,
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
        if m.compressed is None:
            return Part(text)
        c, figure = m.compressed, ctx.report.main.figure
        text += (
            f"\n\nReference compressors of the same {split} text, its {c.n_bytes:,} bytes in stream order (the files, "
            "their separators and their order as the models' data stream reads them): zlib and lzma compress the "
            f"split whole, using its repetition up to 32 KB (zlib) or megabytes (lzma) back; the order-{c.order} "
            "byte n-gram model is fitted on train and uses no repetition within the test text "
            "(`posenc_lab_analysis.compressors`). The models' figures are on their scored tokens, a share of the "
            f"same text. zlib {c.zlib:.3f}, lzma {c.lzma:.3f}, n-gram {c.ngram:.3f} {figure}; the best model "
            f"{min(m.models.values()):.3f}: "
            + (
                f"{min(m.models.values()) - c.lzma:+.3f} {figure} from lzma, repetition a model with a longer reach "
                "could use."
                if min(m.models.values()) > c.lzma
                else "below lzma."
            )
        )
        table = Table(
            "table_compressors",
            compressor_table(c, m.models, figure),
            f"the {split} text's {figure} under reference compressors, beside each cell as trained",
            decimals={figure: 3},
        )
        return Part(text, [table])
