"""enwik8 and text8, Matt Mahoney's Wikipedia dumps: downloaded once, split 90M / 5M / 5M."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .cache import cached, check_writable, key_dir, split_file
from .download import DownloadError, download, extract_member, offline_hint, source_url
from .registry import Corpus, register_corpus

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
MAHONEY_SIZE = 100_000_000  # both files unzipped
MAHONEY_SPLIT = (90_000_000, 5_000_000, 5_000_000)  # the standard first 90M / next 5M / last 5M


def _fetch(root: Path, name: str, url: str, expected_size: int | None, md5: str | None) -> Path:
    """The path of the unzipped file `name`, downloaded and extracted once."""
    raw = root / name / name
    if not raw.exists():
        check_writable(raw.parent)
        archive = download(
            url, root / name / f"{name}.zip", md5=md5, hint=offline_hint(name, f"the unzipped file `{name}` at {raw}")
        )
        extract_member(archive, name, raw, expected_size=expected_size)
    elif expected_size is not None and raw.stat().st_size != expected_size:
        raise DownloadError(
            f"{raw} has {raw.stat().st_size:,} bytes, expected {expected_size:,}; delete it to download again"
        )
    return raw


@register_corpus("enwik8", unit="byte")
def load_enwik8(
    root: Path,
    *,
    url: str | None = None,
    expected_size: int | None = MAHONEY_SIZE,
    md5: str | None = None,
    split_sizes=MAHONEY_SPLIT,
) -> Corpus:
    """Byte-level enwik8 (vocab 256): the unzipped file's bytes, split and cached (checked by content)."""
    raw = _fetch(root, "enwik8", source_url("enwik8", url, ENWIK8_URL), expected_size, md5)
    key = {"version": 1, "split_sizes": list(split_sizes), "size": raw.stat().st_size}

    def build():
        return split_file("enwik8", raw, split_sizes), None, {}

    arrays, _, _ = cached(key_dir(root / "enwik8", key), key, build)
    return Corpus("enwik8", **arrays, vocab_size=256)


@register_corpus("text8", unit="char")
def load_text8(
    root: Path,
    *,
    url: str | None = None,
    expected_size: int | None = MAHONEY_SIZE,
    md5: str | None = None,
    split_sizes=MAHONEY_SPLIT,
) -> Corpus:
    """Character-level text8: ids index the sorted characters of train (27: space and a-z)."""
    raw = _fetch(root, "text8", source_url("text8", url, TEXT8_URL), expected_size, md5)
    key = {"version": 1, "split_sizes": list(split_sizes), "size": raw.stat().st_size}

    def build():
        parts = split_file("text8", raw, split_sizes)
        chars = np.unique(parts["train"])
        lookup = np.full(256, -1, dtype=np.int16)
        lookup[chars] = np.arange(len(chars))
        arrays = {}
        for split, part in parts.items():
            ids = lookup[part]
            if (ids < 0).any():
                raise ValueError(
                    f"text8: {split} has characters absent from train: "
                    f"{sorted(set(bytes(part[ids < 0][:100]).decode('latin-1')))}"
                )
            arrays[split] = ids.astype(np.uint8)
        return arrays, [chr(c) for c in chars], {}

    arrays, itos, _ = cached(key_dir(root / "text8", key), key, build)
    return Corpus("text8", **arrays, vocab_size=len(itos), itos=itos)
