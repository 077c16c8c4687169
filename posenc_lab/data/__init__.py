"""Corpora and ordered segment streams. Imports only the standard library, numpy and torch.

    from posenc_lab.data import load_corpus
    corpus = load_corpus("recall")                      # or pystdlib, textfile, enwik8, text8, ...
    train = corpus.stream("train", segment_len=32, n_streams=16, cycle=True)
    loader = torch.utils.data.DataLoader(train, batch_size=None)
"""

from .corpora import CORPORA, SPLITS, Corpus, load_corpus, register_corpus
from .download import DownloadError, cache_root
from .recall import make_recall
from .streams import SegmentStream

CORPUS_NAMES = tuple(sorted(CORPORA))

__all__ = ["CORPORA", "CORPUS_NAMES", "SPLITS", "Corpus", "DownloadError", "SegmentStream", "cache_root",
           "load_corpus", "make_recall", "register_corpus"]
