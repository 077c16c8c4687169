"""The corpus registry (posenc_lab/data/registry.py): an unknown corpus lists the
valid names."""

import pytest

from posenc_lab.data import CORPUS_NAMES, load_corpus


def test_unknown_corpus_lists_the_valid_names():
    assert {"pystdlib", "recall", "enwik8", "text8", "wikitext103", "wikitext2", "textfile", "hf"} <= set(CORPUS_NAMES)
    with pytest.raises(ValueError, match=r"unknown corpus 'nope'; valid: .*enwik8.*pystdlib.*recall"):
        load_corpus("nope")
