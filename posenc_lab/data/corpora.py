"""Corpora: train/valid/test token arrays plus vocabulary, behind one registry.

    corpus = load_corpus("pystdlib", root=None, max_bytes=1_000_000)
    stream = corpus.stream("train", segment_len=128, n_streams=16, cycle=True)

Prepared arrays are cached under the cache root (see download.cache_root) as .npy files with a
manifest.json written last; a later load maps them read-only (np.load(mmap_mode="r")).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .download import DownloadError, atomic_path, cache_root, download, extract_member, save_npy, write_json
from .recall import make_recall, recall_vocab
from .streams import SegmentStream

SPLITS = ("train", "valid", "test")


@dataclass
class Corpus:
    """One corpus. train/valid/test: 1-D integer token arrays (often read-only memmaps).

    unit: "byte" | "char" | "word", as registered (``register_corpus``); itos: id -> symbol (None for bytes,
    where id = byte value);
    side: per split, optional side arrays {"loss_mask": [N] bool, "distance": [N] int} (recall).
    """

    name: str
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab_size: int
    unit: str = ""  # filled in by load_corpus from the registration
    itos: list[str] | None = None
    side: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def split(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        return getattr(self, split)

    def stream(self, split: str, segment_len: int, n_streams: int, **kwargs) -> SegmentStream:
        """A SegmentStream over one split, with that split's side arrays (kwargs: see SegmentStream)."""
        return SegmentStream(self.split(split), segment_len, n_streams, **self.side.get(split, {}), **kwargs)


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


def load_corpus(name: str, root: str | os.PathLike | None = None, **kwargs) -> Corpus:
    """Load corpus `name`, preparing and caching it under `root` (default: the cache root) if needed."""
    check_corpus_options(name, kwargs)
    corpus = CORPORA[name](cache_root(root), **kwargs)
    corpus.unit = CORPUS_UNITS[name]
    return corpus


# ---- cache of prepared arrays ----


def _key_dir(base: Path, key: dict) -> Path:
    """A cache directory per set of preparation settings."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return base / digest


def _cached(directory: Path, key: dict, build: Callable[[], tuple[dict, list | None, dict]]):
    """Return (arrays per split as memmaps, itos, info), building and saving them on the first call.

    build() -> (arrays {file stem: 1-D array}, itos or None, info: JSON-able facts for the manifest).
    The manifest is written last, so a half-written cache is rebuilt rather than trusted.
    """
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    if manifest is None or manifest.get("key") != key:
        arrays, itos, info = build()
        directory.mkdir(parents=True, exist_ok=True)
        for split, array in arrays.items():
            save_npy(directory / f"{split}.npy", array)
        if itos is not None:
            with atomic_path(directory / "vocab.txt") as tmp:
                tmp.write_text("\n".join(itos) + "\n", encoding="utf-8")
        manifest = {"key": key, "info": info, "n_tokens": {s: len(a) for s, a in arrays.items()}}
        write_json(manifest_path, manifest)
    arrays = {s: np.load(directory / f"{s}.npy", mmap_mode="r") for s in manifest["n_tokens"]}
    itos = None
    if (directory / "vocab.txt").exists():
        itos = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    return arrays, itos, manifest["info"]


def _split_file(name: str, path: Path, sizes) -> dict[str, np.memmap]:
    """The file's first sizes[0] bytes as train, the next sizes[1] as valid, then sizes[2] as test:
    read-only uint8 memmaps of the file itself (no copy)."""
    size = path.stat().st_size
    if len(sizes) != 3 or min(sizes) < 2 or sum(sizes) > size:
        raise ValueError(
            f"{name}: split sizes must be 3 sizes >= 2 bytes summing to <= the size of {path} "
            f"({size:,} bytes), got {tuple(sizes)}"
        )
    cuts = np.cumsum([0, *sizes]).tolist()
    return {
        s: np.memmap(path, dtype=np.uint8, mode="r", offset=a, shape=(b - a,))
        for s, a, b in zip(SPLITS, cuts, cuts[1:])
    }


# ---- pystdlib: the embedded default ----

FILE_SEPARATOR = b"\x1c"  # ASCII "file separator", between concatenated source files
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_split_of(relpath: str) -> str:
    """Split of one file by a hash of its relative path: stable, ~90/5/5, independent of the others."""
    bucket = int(hashlib.md5(relpath.encode()).hexdigest()[:8], 16) % 20
    return "valid" if bucket == 0 else "test" if bucket == 1 else "train"


def stdlib_files(stdlib: Path, include_tests: bool = False) -> list[str]:
    """Relative paths ('/'-separated) of the .py files under `stdlib`, sorted."""
    skip = _SKIP_DIRS if include_tests else _SKIP_DIRS | _TEST_DIRS
    found = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in skip]
        rel = Path(dirpath).relative_to(stdlib)
        found += [(rel / f).as_posix() for f in filenames if f.endswith(".py")]
    return sorted(found)


@register_corpus("pystdlib", unit="byte")
def load_pystdlib(
    root: Path,
    *,
    max_bytes: int | None = None,
    include_tests: bool = False,
    stdlib_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Byte-level corpus of the running Python's standard library sources (vocab 256).

    Files are split by stdlib_split_of and concatenated in path order with FILE_SEPARATOR after
    each; `max_bytes` caps the total (train 90%, valid and test 5% each) for quick runs.
    """
    stdlib = Path(stdlib_dir or sysconfig.get_paths()["stdlib"]).resolve()
    if not stdlib.is_dir():
        raise FileNotFoundError(f"pystdlib: no standard library directory at {stdlib}")
    if max_bytes is not None and max_bytes < 100:
        raise ValueError(f"pystdlib: max_bytes must be None or >= 100, got {max_bytes}")
    key = {
        "version": 1,
        "stdlib": str(stdlib),
        "python": platform.python_version(),
        "max_bytes": max_bytes,
        "include_tests": include_tests,
    }

    def build():
        files = {s: [] for s in SPLITS}
        for rel in stdlib_files(stdlib, include_tests):
            files[stdlib_split_of(rel)].append(rel)
        budget = {s: None if max_bytes is None else int(max_bytes * f) for s, f in zip(SPLITS, (0.9, 0.05, 0.05))}
        arrays, used = {}, {}
        for split in SPLITS:
            parts, size = [], 0
            for rel in files[split]:
                if budget[split] is not None and size >= budget[split]:
                    break
                parts.append((stdlib / rel).read_bytes() + FILE_SEPARATOR)
                size += len(parts[-1])
            arrays[split] = np.frombuffer(b"".join(parts)[: budget[split]], dtype=np.uint8)
            used[split] = files[split][: len(parts)]
        return arrays, None, {"files": used}

    arrays, _, _ = _cached(_key_dir(root / "pystdlib", key), key, build)
    return Corpus("pystdlib", **arrays, vocab_size=256)


# ---- textfile: any local file, bytes ----


@register_corpus("textfile", unit="byte")
def load_textfile(
    root: Path, *, path: str | os.PathLike, split: tuple[float, float, float] = (0.9, 0.05, 0.05)
) -> Corpus:
    """Byte-level corpus of one local file, split by position (fractions train/valid/test).

    The file itself is memory-mapped, so nothing is cached.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"textfile corpus: no file at {path}")
    if len(split) != 3 or min(split) <= 0 or sum(split) > 1 + 1e-9:
        raise ValueError(f"textfile corpus: split must be 3 positive fractions summing to <= 1, got {split}")
    size = path.stat().st_size
    regions = _split_file("textfile corpus", path, [int(f * size) for f in split])
    return Corpus("textfile", **regions, vocab_size=256)


# ---- enwik8 and text8 (Matt Mahoney's Wikipedia dumps) ----

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
MAHONEY_SIZE = 100_000_000  # both files unzipped
MAHONEY_SPLIT = (90_000_000, 5_000_000, 5_000_000)  # the standard first 90M / next 5M / last 5M


def _url_env(name: str) -> str:
    return f"POSENC_LAB_{name.upper()}_URL"


def _url(name: str, url: str | None, default: str) -> str:
    """url kwarg, else $POSENC_LAB_<NAME>_URL, else the official source."""
    return url or os.environ.get(_url_env(name)) or default


def _offline_hint(name: str, extracted: str) -> str:
    """The rest of the offline error: where extracted files would do, and how to use a mirror."""
    return f" (or {extracted}); for a mirror pass url=... or set {_url_env(name)}"


def _fetch_mahoney(root: Path, name: str, url: str, expected_size: int | None, md5: str | None) -> Path:
    """Return the path of the unzipped file `name`, downloading and extracting it once."""
    raw = root / name / name
    if not raw.exists():
        archive = download(
            url, root / name / f"{name}.zip", md5=md5, hint=_offline_hint(name, f"the unzipped file `{name}` at {raw}")
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
    """Byte-level enwik8 (vocab 256), memory-mapped straight from the unzipped file."""
    raw = _fetch_mahoney(root, "enwik8", _url("enwik8", url, ENWIK8_URL), expected_size, md5)
    return Corpus("enwik8", **_split_file("enwik8", raw, split_sizes), vocab_size=256)


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
    raw = _fetch_mahoney(root, "text8", _url("text8", url, TEXT8_URL), expected_size, md5)
    parts = _split_file("text8", raw, split_sizes)
    key = {"version": 1, "split_sizes": list(split_sizes), "size": raw.stat().st_size}

    def build():
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

    arrays, itos, _ = _cached(_key_dir(root / "text8", key), key, build)
    return Corpus("text8", **arrays, vocab_size=len(itos), itos=itos)


# ---- WikiText (word level) ----

WIKITEXT_URLS = {
    "wikitext103": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
    "wikitext2": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
}
_WIKITEXT_FOLDERS = {"wikitext103": "wikitext-103", "wikitext2": "wikitext-2"}
_WIKITEXT_FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}


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


def _load_wikitext(root: Path, name: str, url: str | None, md5: str | None) -> Corpus:
    url = _url(name, url, WIKITEXT_URLS[name])
    folder = _WIKITEXT_FOLDERS[name]
    base = root / name
    files = {s: base / folder / f for s, f in _WIKITEXT_FILES.items()}
    if not all(p.exists() for p in files.values()):
        archive = download(
            url,
            base / Path(url).name,
            md5=md5,
            hint=_offline_hint(name, f"the extracted {', '.join(_WIKITEXT_FILES.values())} in {base / folder}"),
        )
        for split, path in files.items():
            extract_member(archive, f"{folder}/{_WIKITEXT_FILES[split]}", path)
    key = {"version": 1, "sizes": {s: p.stat().st_size for s, p in files.items()}}

    def build():
        itos = build_word_vocab(files["train"])
        stoi = {w: i for i, w in enumerate(itos)}
        return {s: encode_words(p, stoi) for s, p in files.items()}, itos, {}

    arrays, itos, _ = _cached(_key_dir(base / "tokens", key), key, build)
    return Corpus(name, **arrays, vocab_size=len(itos), itos=itos)


@register_corpus("wikitext103", unit="word")
def load_wikitext103(root: Path, *, url: str | None = None, md5: str | None = None) -> Corpus:
    """WikiText-103, word level: vocabulary from train, `<eos>` per line, `<unk>` as in the data."""
    return _load_wikitext(root, "wikitext103", url, md5)


@register_corpus("wikitext2", unit="word")
def load_wikitext2(root: Path, *, url: str | None = None, md5: str | None = None) -> Corpus:
    """WikiText-2, word level: vocabulary from train, `<eos>` per line, `<unk>` as in the data."""
    return _load_wikitext(root, "wikitext2", url, md5)


# ---- recall: the synthetic probe ----


@register_corpus("recall", unit="word", answers=True)
def load_recall(
    root: Path,
    *,
    seed: int = 0,
    n_values: int = 16,
    n_filler: int = 32,
    min_distance: int = 2,
    max_distance: int = 80,
    eval_max_distance: int | None = None,
    max_gap: int = 8,
    train_tokens: int = 1_000_000,
    eval_tokens: int = 100_000,
) -> Corpus:
    """The recall probe (see recall.py); each split has its own seed. Cached like the others so
    that streams hold memmaps (cheap to send to DataLoader workers).

    eval_max_distance: valid/test distances reach this far instead of max_distance (to test
    recall past the distances seen in training).
    """
    eval_max = max_distance if eval_max_distance is None else eval_max_distance
    settings = dict(
        seed=seed,
        n_values=n_values,
        n_filler=n_filler,
        min_distance=min_distance,
        max_distance=max_distance,
        eval_max_distance=eval_max,
        max_gap=max_gap,
        train_tokens=train_tokens,
        eval_tokens=eval_tokens,
    )

    def build():
        common = dict(n_values=n_values, n_filler=n_filler, min_distance=min_distance, max_gap=max_gap)
        arrays = {}
        for i, (split, n, max_d) in enumerate(
            zip(SPLITS, (train_tokens, eval_tokens, eval_tokens), (max_distance, eval_max, eval_max))
        ):
            tokens, loss_mask, distance = make_recall(n, seed=[seed, i], max_distance=max_d, **common)
            arrays.update({split: tokens, f"{split}.loss_mask": loss_mask, f"{split}.distance": distance})
        return arrays, recall_vocab(n_values, n_filler), {}

    key = {"version": 1, **settings}
    arrays, itos, _ = _cached(_key_dir(root / "recall", key), key, build)
    side = {s: {"loss_mask": arrays[f"{s}.loss_mask"], "distance": arrays[f"{s}.distance"]} for s in SPLITS}
    return Corpus(
        "recall", arrays["train"], arrays["valid"], arrays["test"], vocab_size=len(itos), itos=itos, side=side
    )


# ---- hf: any text dataset through the optional `datasets` library ----


def _data_files(data_files):
    """data_files with every local path absolute, and {path: [size, mtime_ns]} of those files (for the cache
    key: an edited file is prepared again). Globs and URLs are passed on as given."""
    if data_files is None:
        return None, {}
    stamps = {}

    def local(f):
        if "://" in str(f) or any(c in str(f) for c in "*?["):
            return str(f)
        p = Path(f).expanduser().resolve()
        if not p.is_file():
            raise FileNotFoundError(f"hf corpus: no data file at {p} (data_files: {data_files})")
        stamps[str(p)] = [p.stat().st_size, p.stat().st_mtime_ns]
        return str(p)

    def each(v):
        return local(v) if isinstance(v, (str, os.PathLike)) else [local(f) for f in v]

    files = {k: each(v) for k, v in data_files.items()} if isinstance(data_files, dict) else each(data_files)
    return files, stamps


@register_corpus("hf", unit="byte")
def load_hf(
    root: Path,
    *,
    path: str,
    config: str | None = None,
    data_files=None,
    text_field: str = "text",
    splits: tuple[str, str, str] = ("train", "validation", "test"),
    separator: str = "\n",
) -> Corpus:
    """Byte-level corpus of a Hugging Face dataset's text field (UTF-8), texts joined by `separator`.

    path, config, data_files: as datasets.load_dataset(path, config, data_files=...) takes them: a dataset
    of the Hub, or a builder over local files, e.g. path="text" (one text per line) or "json" with
    data_files={"train": "a.txt", "validation": "b.txt", "test": "c.txt"}. `splits` names the dataset's
    train/valid/test splits. Prepared once, then read from the cache (no `datasets` needed after that).
    """
    data_files, stamps = _data_files(data_files)
    key = {
        "version": 1,
        "path": path,
        "config": config,
        "text_field": text_field,
        "splits": list(splits),
        "separator": separator,
        **({"data_files": data_files, "stamps": stamps} if data_files else {}),
    }

    def build():
        try:
            import datasets
        except ImportError as e:
            raise ImportError(
                "the 'hf' corpus needs the optional `datasets` library: pip install posenc-lab[hf]"
            ) from e
        try:
            ds = datasets.load_dataset(path, config, data_files=data_files)
        except Exception as e:  # datasets raises many kinds; all mean "not available"
            raise RuntimeError(
                f"hf corpus: could not load dataset {path!r} (config {config!r}): {e}. Offline, it "
                f"must already be in the Hugging Face cache; run once online to prepare it."
            ) from e
        missing = [s for s in splits if s not in ds]
        if missing:
            raise ValueError(f"hf corpus: dataset {path!r} has no split {missing}; available: {list(ds)}")
        columns = ds[splits[0]].column_names
        if text_field not in columns:
            raise ValueError(
                f"hf corpus: dataset {path!r} has no field text_field={text_field!r}; available: {columns}"
            )
        arrays = {}
        for ours, theirs in zip(SPLITS, splits):
            text = separator.join(ds[theirs][text_field]).encode("utf-8")
            arrays[ours] = np.frombuffer(text, dtype=np.uint8)
        return arrays, None, {}

    arrays, _, _ = _cached(_key_dir(root / "hf", key), key, build)
    return Corpus("hf", **arrays, vocab_size=256)
