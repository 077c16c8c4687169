"""Corpora and ordered segment streams. Imports only the standard library, numpy and torch.

from posenc_lab.data import load_corpus
corpus = load_corpus("recall")                      # or pystdlib, textfile, enwik8, text8, ...
train = corpus.stream("train", segment_len=32, n_streams=16, cycle=True)
loader = torch.utils.data.DataLoader(train, batch_size=None)
"""

from .corpora import ANSWER_CORPORA, CORPORA, CORPUS_UNITS, SPLITS, Corpus, load_corpus, register_corpus
from .download import DownloadError, cache_root
from .recall import make_recall
from .streams import SegmentStream

CORPUS_NAMES = tuple(sorted(CORPORA))

__all__ = [
    "ANSWER_CORPORA",
    "CORPORA",
    "CORPUS_NAMES",
    "CORPUS_UNITS",
    "SPLITS",
    "Corpus",
    "DownloadError",
    "SegmentStream",
    "cache_root",
    "load_corpus",
    "make_recall",
    "register_corpus",
]
