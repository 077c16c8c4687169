"""textfile, one text file as a corpus (posenc_lab/data/textfile.py): the split by
position, read from a copy that follows the file, a missing file named."""

import os
from pathlib import Path

import numpy as np
import pytest

from posenc_lab.data import load_corpus
from posenc_lab.rundir import corpus_identity


def test_textfile_splits_by_position(tmp_path):
    content = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "t.txt").write_bytes(content)
    c = load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt")
    assert (c.vocab_size, c.unit) == (256, "byte")
    assert (len(c.train), len(c.val), len(c.test)) == (9216, 512, 512)
    assert bytes(c.train) + bytes(c.val) + bytes(c.test) == content
    c = load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt", split=(0.5, 0.25, 0.25))
    assert bytes(c.val) == content[5120:7680]


def test_textfile_too_small_for_the_split(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"0123456789")
    with pytest.raises(ValueError, match=r"t\.txt \(data\.corpus\.path\) is too small: 10 bytes cannot be split"):
        load_corpus("textfile", root=tmp_path, path=tmp_path / "t.txt")


def test_textfile_is_read_from_a_copy_that_follows_the_file(tmp_path):
    """Runs map the cache's copy, never the user's file (one that shrinks under a memory map kills with SIGBUS); a
    changed file is copied again into the same entry, and a corpus already loaded keeps its data."""
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (10_240, 20_480))
    (tmp_path / "t.txt").write_bytes(first)
    before = load_corpus("textfile", root=tmp_path / "cache", path=tmp_path / "t.txt")
    assert Path(before.train.filename).is_relative_to(tmp_path / "cache")
    (tmp_path / "t.txt").write_bytes(second)
    after = load_corpus("textfile", root=tmp_path / "cache", path=tmp_path / "t.txt")
    assert bytes(after.train) == second[:18_432] and bytes(before.train) == first[:9216]
    assert len(list((tmp_path / "cache" / "textfile").iterdir())) == 1  # the copy of that path replaced, not added


def test_textfile_same_size_text_with_its_mtime_kept_is_copied_again(tmp_path):
    """The copy was once keyed on size and modification time, so ``cp -p`` of other text of the same size
    left runs on the old copy, with the old corpus hash."""
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(97, 123)) * 400)
    before = load_corpus("textfile", root=tmp_path / "cache", path=text)
    sha, stamp = corpus_identity(before)["sha256"], text.stat()
    text.write_bytes(bytes(range(65, 91)) * 400)  # the same length, other bytes, its time put back
    os.utime(text, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = load_corpus("textfile", root=tmp_path / "cache", path=text)
    assert bytes(after.train) == (bytes(range(65, 91)) * 400)[: len(after.train)]
    assert corpus_identity(after)["sha256"] != sha


def test_textfile_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file at .*missing.txt"):
        load_corpus("textfile", root=tmp_path, path=tmp_path / "missing.txt")
