"""Corpora: train/val/test token arrays plus vocabulary, behind one registry.

    corpus = load_corpus("pystdlib", root=None, max_bytes=1_000_000)
    stream = corpus.stream("train", segment_len=128, n_streams=16, cycle=True)

A corpus family is one module of this package that registers its loaders (``@register_corpus``);
every module here is imported, so registering is discovering (as for the positional schemes).
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .cache import CACHE_ENV, CacheUnwritable, cache_root, cache_setting
from .splits import check_split
from .streams import SegmentStream

#: Corpora without natural documents are cut into chunks of this many tokens for the statistics
#: (``Corpus.documents``): the unit of resampling must span the text's correlation length.
DOCUMENT_CHUNK = 4096


@dataclass
class Corpus:
    """One corpus. train/val/test: 1-D integer token arrays (often read-only memmaps).

    unit: "byte" | "char" | "word", as registered (``register_corpus``); itos: id -> symbol (None for bytes,
    where id = byte value); side: per split, optional side arrays {"loss_mask": [N] bool, "distance": [N]
    int} (recall), and {"position_ids": {kind: [N] int}} (a task's, ``model.data_positions``);
    document_separator: the token that ends every document (pystdlib's file separator),
    None where the corpus has no natural documents: they are then cut into chunks of ``document_chunk`` tokens.
    A corpus split by family (``families.py``: pystdlib, textdir) also gives, per split, document_lengths
    [n_documents] (tokens of every document, its separator included), document_families [n_documents] (its
    family, 0..n_families-1 in text order) and family_names [n_families].
    """

    name: str
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab_size: int
    unit: str = ""  # filled in by load_corpus from the registration
    itos: list[str] | None = None
    side: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    document_separator: int | None = None
    document_chunk: int = DOCUMENT_CHUNK
    document_lengths: dict[str, np.ndarray] = field(default_factory=dict)
    document_families: dict[str, np.ndarray] = field(default_factory=dict)
    family_names: dict[str, list[str]] = field(default_factory=dict)
    align: int = 0  # > 0: documents start at multiples of it, and so must the streams (lengthgen's aligned layout)
    #: the largest position id of each kind the side arrays ``position_ids`` hold, over every split (lengthgen)
    position_id_max: dict[str, int] = field(default_factory=dict)

    def split(self, split: str) -> np.ndarray:
        return getattr(self, check_split(split))

    def stream(self, split: str, segment_len: int, n_streams: int, **kwargs) -> SegmentStream:
        """A SegmentStream over one split, with that split's side arrays (kwargs: see SegmentStream)."""
        side = self.side.get(split, {})
        return SegmentStream(self.split(split), segment_len, n_streams, **side, align=self.align, **kwargs)

    def documents(self, split: str) -> np.ndarray:
        """[n_tokens] int64: the document of every token of ``split``, numbered from 0 in text order.

        With a ``document_separator`` a document ends with its separator (so a target separator belongs
        to the document it closes); otherwise the documents are consecutive chunks of ``document_chunk`` tokens.
        """
        tokens = self.split(split)
        if split in self.document_lengths:  # a file may hold the separator byte itself: its length decides
            lengths = np.asarray(self.document_lengths[split])
            return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        if self.document_separator is None:
            return np.arange(len(tokens), dtype=np.int64) // self.document_chunk
        ends = np.asarray(tokens) == self.document_separator
        return np.concatenate([[0], np.cumsum(ends[:-1], dtype=np.int64)])

    def families(self, split: str) -> np.ndarray:
        """[n_tokens] int64: the unit of independence of every token of ``split``, numbered from 0 in text order.

        For a corpus split by family (pystdlib, textdir) the family of its document (a package joined with its
        near-duplicates: what no other family shares); for any other corpus every document (or chunk,
        ``documents``) is its own family. The report's intervals cluster by it."""
        if split not in self.document_families:
            return self.documents(split)
        return np.asarray(self.document_families[split], dtype=np.int64)[self.documents(split)]

    def units_name(self, split: str) -> str:
        """What ``families`` counts on ``split``: "families" (a corpus split by family) or "documents"."""
        return "families" if split in self.document_families else "documents"

    def family_sizes(self, split: str) -> np.ndarray:
        """[n_families] int64: the tokens of ``split`` in each family of ``families``."""
        return np.bincount(self.families(split))

    def family_labels(self, split: str) -> list[str]:
        """The name of each family of ``split`` (its packages), or of each document ("document 7") where the
        corpus has no families."""
        if split in self.family_names:
            return list(self.family_names[split])
        return [f"document {i}" for i in range(len(self.family_sizes(split)))]


CORPORA: dict[str, Callable[..., Corpus]] = {}
CORPUS_UNITS: dict[str, str] = {}  # name -> "byte" | "char" | "word": bits per token or perplexity
ANSWER_CORPORA: set[str] = set()  # corpora whose tokens carry recall distances (accuracy is measured)


def register_corpus(name: str, unit: str, answers: bool = False):
    """Decorator: make `fn(root: Path, **kwargs) -> Corpus` loadable as load_corpus(name, ...); its tokens are
    ``unit``s ("byte", "char", "word"); ``answers``: its batches carry recall distances."""
    if unit not in ("byte", "char", "word"):
        raise ValueError(f"corpus {name!r}: unit must be byte, char or word, got {unit!r}")

    def add(fn):
        CORPORA[name], CORPUS_UNITS[name] = fn, unit
        if answers:
            ANSWER_CORPORA.add(name)
        return fn

    return add


def corpus_options(name: str) -> list[str]:
    """The options corpus `name` takes (its loader's keyword arguments, the cache root aside)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; valid: {', '.join(sorted(CORPORA))}")
    params = list(inspect.signature(CORPORA[name]).parameters.values())[1:]
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_corpus_options(name: str, options: Iterable[str]) -> None:
    """Refuse options corpus `name` does not take, naming them and the valid ones (before any work).

    A preset that sets one corpus's option (say pystdlib's max_bytes) then fails clearly, not with a
    TypeError deep in a loader, when a user swaps the corpus (data=textfile).
    """
    valid = corpus_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"corpus {name!r} takes no option {', '.join(unknown)} (data.corpus.*); its options: "
            f"{', '.join(valid) or 'none'}"
        )


def _expected(annotation) -> tuple[str, Callable[[object], bool]] | None:
    """(what a value must be, its test) for a loader option annotated with a plain type, or None (not checked)."""
    args = set(typing.get_args(annotation)) if isinstance(annotation, types.UnionType) else {annotation}
    null = type(None) in args
    args.discard(type(None))
    plain = {
        frozenset({int}): ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
        frozenset({float}): ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
        frozenset({bool}): ("true or false", lambda v: isinstance(v, bool)),
        frozenset({str}): ("a string", lambda v: isinstance(v, str)),
        frozenset({str, os.PathLike}): ("a path (a string; quote a name of digits: '2024')", _is_path),
    }.get(frozenset(args))
    if plain is None:
        return None
    what, test = plain
    return (f"{what} or null", lambda v: v is None or test(v)) if null else plain


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def path_options(name: str) -> list[str]:
    """The options of corpus ``name`` that are local paths (annotated ``os.PathLike``): where its text lives."""
    hints = typing.get_type_hints(CORPORA[name])
    return [k for k in corpus_options(name) if os.PathLike in typing.get_args(hints.get(k))]


def option_problems(name: str, options: Mapping) -> list[str]:
    """``data.corpus.KEY must be ..., got ...`` for each option of corpus ``name`` whose value is not of the type
    its loader's signature gives (integers, numbers, flags, strings, paths), checked before anything is built."""
    hints = typing.get_type_hints(CORPORA[name])
    out = []
    for key, value in options.items():
        expected = _expected(hints.get(key)) if key in hints else None
        if expected is not None and not expected[1](value):
            out.append(f"data.corpus.{key} must be {expected[0]}, got {value!r}")
    return out


def load_corpus(name: str, root: str | os.PathLike | None = None, **kwargs) -> Corpus:
    """Load corpus `name`, preparing and caching it under `root` (default: the cache root) if needed."""
    check_corpus_options(name, kwargs)
    try:
        corpus = CORPORA[name](cache_root(root), **kwargs)
    except CacheUnwritable as e:  # named with the setting that chose the folder
        raise CacheUnwritable(
            f"{cache_setting(root)}: {e}; corpus {name} with these options is prepared there on first use, so set "
            f"data.root (or ${CACHE_ENV}) to a folder this process can write"
        ) from e
    corpus.unit = CORPUS_UNITS[name]
    return corpus
