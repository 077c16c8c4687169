"""The corpus cache, checked by content (posenc_lab/data/cache.py)."""

import json
import re
import shutil

import numpy as np
import pytest

from posenc_lab.data import load_corpus
from posenc_lab.data.cache import DIGEST, CacheContentError
from posenc_lab.rundir import corpus_identity

RECALL_SMALL = dict(train_tokens=5000, eval_tokens=1000, max_distance=20)


@pytest.mark.parametrize("name", ["train.npy", "val.distance.npy", "vocab.txt"])
def test_a_cache_file_with_other_content_is_refused_naming_it_and_the_folder_to_delete(tmp_path, name):
    first = load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    reference, itos = corpus_identity(first), first.itos  # before the edit below, which its memmaps would see
    (path,) = tmp_path.rglob(name)
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 1  # one bit: the file still reads, at its length
    path.write_bytes(bytes(content))
    message = rf"corpus cache file {re.escape(str(path))} is not the file posenc-lab wrote there \({DIGEST} "
    with pytest.raises(CacheContentError, match=message + rf".*Delete {re.escape(str(path.parent))} to prepare"):
        load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    shutil.rmtree(path.parent)  # what the message says to do
    again = load_corpus("recall", root=tmp_path, **RECALL_SMALL)
    assert corpus_identity(again) == reference and again.itos == itos


def test_a_cache_without_digests_is_prepared_again_to_the_same_tokens(tmp_path, fake_stdlib, caplog):
    """An entry of an older posenc-lab cannot be vouched for: it is built again, never adopted, and its tokens (so
    the corpus hash of run.json) are those of the same source."""
    reference = corpus_identity(load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib))
    (path,) = tmp_path.rglob("manifest.json")
    old = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in old.items() if k != DIGEST}))
    (train,) = tmp_path.rglob("train.npy")
    np.save(train, np.load(train)[::-1])  # content that only a check would catch
    with caplog.at_level("WARNING", logger="posenc_lab.data"):
        again = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    assert f"corpus cache {path.parent} has no content digests" in caplog.text
    assert corpus_identity(again) == reference and json.loads(path.read_text()) == old
