"""WikiText-103 and WikiText-2, word level: downloaded once, vocabulary from train, `<eos>` per line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from .cache import cached, check_writable, key_dir
from .download import download, extract_member, offline_hint, source_url
from .registry import Corpus, register_corpus

WIKITEXT_URLS = {
    "wikitext103": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
    "wikitext2": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
}
_FOLDERS = {"wikitext103": "wikitext-103", "wikitext2": "wikitext-2"}
_FILES = {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"}


def _words(path: Path):
    """Whitespace-split words of each line, then `<eos>` (an empty line gives `<eos>` alone)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield from line.split()
            yield "<eos>"


def build_word_vocab(path: Path) -> list[str]:
    """Words of `path`, most frequent first (ties in order of first appearance)."""
    return [w for w, _ in Counter(_words(path)).most_common()]


def encode_words(path: Path, stoi: dict[str, int]) -> np.ndarray:
    """Word ids of `path` [N] int32; words absent from the vocabulary become `<unk>`."""
    unk = stoi.get("<unk>")

    def ids():
        for w in _words(path):
            i = stoi.get(w, unk)
            if i is None:
                raise ValueError(f"{path}: word {w!r} is not in the vocabulary and there is no <unk>")
            yield i

    return np.fromiter(ids(), dtype=np.int32)


def _load(root: Path, name: str, url: str | None, md5: str | None) -> Corpus:
    url = source_url(name, url, WIKITEXT_URLS[name])
    folder = _FOLDERS[name]
    base = root / name
    files = {s: base / folder / f for s, f in _FILES.items()}
    if not all(p.exists() for p in files.values()):
        check_writable(base)
        archive = download(
            url,
            base / Path(url).name,
            md5=md5,
            hint=offline_hint(name, f"the extracted {', '.join(_FILES.values())} in {base / folder}"),
        )
        for split, path in files.items():
            extract_member(archive, f"{folder}/{_FILES[split]}", path)
    key = {"version": 1, "sizes": {s if s != "val" else "valid": p.stat().st_size for s, p in files.items()}}

    def build():
        itos = build_word_vocab(files["train"])
        stoi = {w: i for i, w in enumerate(itos)}
        return {s: encode_words(p, stoi) for s, p in files.items()}, itos, {}

    arrays, itos, _ = cached(key_dir(base / "tokens", key), key, build)
    return Corpus(name, **arrays, vocab_size=len(itos), itos=itos)


@register_corpus("wikitext103", unit="word")
def load_wikitext103(root: Path, *, url: str | None = None, md5: str | None = None) -> Corpus:
    """WikiText-103, word level: vocabulary from train, `<eos>` per line, `<unk>` as in the data."""
    return _load(root, "wikitext103", url, md5)


@register_corpus("wikitext2", unit="word")
def load_wikitext2(root: Path, *, url: str | None = None, md5: str | None = None) -> Corpus:
    """WikiText-2, word level: vocabulary from train, `<eos>` per line, `<unk>` as in the data."""
    return _load(root, "wikitext2", url, md5)
