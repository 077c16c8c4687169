"""Corpora and ordered segment streams. Imports only the standard library, numpy and torch; knows no model.

    from posenc_lab.data import load_corpus
    corpus = load_corpus("recall")                      # or pystdlib, textdir, textfile, enwik8, text8, ...
    train = corpus.stream("train", segment_len=32, n_streams=16, cycle=True)
    loader = torch.utils.data.DataLoader(train, batch_size=None)

Layout: ``registry.py`` (Corpus, the registry), ``cache.py`` (prepared arrays), ``download.py``,
``drawn.py`` (a split drawn on the fly), ``overlap.py`` (verbatim overlap between splits), ``families.py`` (the
split by family of a folder of files, for pystdlib and textdir), ``splits.py`` (the split names), ``streams.py``
(the ordered iterator), and one module per corpus family, each registering its loaders: every module of this
package is imported, so a new corpus is one module (a folder of your own files needs none: ``data=textdir
data.corpus.path=DIR``).
"""

import importlib
import pkgutil

from .cache import cache_root
from .download import DownloadError
from .recall import make_recall
from .registry import (
    ANSWER_CORPORA,
    CORPORA,
    CORPUS_UNITS,
    Corpus,
    check_corpus_options,
    corpus_options,
    load_corpus,
    option_problems,
    path_options,
    register_corpus,
)
from .splits import EVAL_SPLITS, SPLITS, check_split
from .streams import SegmentStream, segment_schedule

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

CORPUS_NAMES = tuple(sorted(CORPORA))

__all__ = [
    "ANSWER_CORPORA",
    "CORPORA",
    "CORPUS_NAMES",
    "CORPUS_UNITS",
    "EVAL_SPLITS",
    "SPLITS",
    "Corpus",
    "DownloadError",
    "SegmentStream",
    "cache_root",
    "check_corpus_options",
    "check_split",
    "corpus_options",
    "load_corpus",
    "make_recall",
    "option_problems",
    "path_options",
    "register_corpus",
    "segment_schedule",
]
