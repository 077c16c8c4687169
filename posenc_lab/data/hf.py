"""hf: any Hugging Face text dataset as a byte-level corpus, through the optional `datasets` library."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .cache import cached, key_dir
from .registry import Corpus, register_corpus
from .splits import SPLITS


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
    train/val/test splits. Prepared once, then read from the cache (no `datasets` needed after that).
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

    arrays, _, _ = cached(key_dir(root / "hf", key), key, build)
    return Corpus("hf", **arrays, vocab_size=256)
