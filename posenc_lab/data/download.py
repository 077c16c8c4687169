"""Atomic downloads with checksums, and zip extraction.

Every file lands under its final name only once it is complete and verified: bytes go to a
temporary file in the same directory, then `os.replace` renames it. An interrupted run
therefore leaves at most a stray `*.tmp` file, never a file that looks finished.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from ..errors import PosencLabError
from ..io import atomic_path

_CHUNK = 1 << 20


class DownloadError(PosencLabError, RuntimeError):
    """A download or a verification failed; the message says what to do instead."""


def url_env(name: str) -> str:
    """The environment variable that names a mirror of corpus `name`'s download."""
    return f"POSENC_LAB_{name.upper()}_URL"


def source_url(name: str, url: str | None, default: str) -> str:
    """url kwarg, else $POSENC_LAB_<NAME>_URL, else the official source."""
    return url or os.environ.get(url_env(name)) or default


def offline_hint(name: str, extracted: str) -> str:
    """The rest of the offline error: where extracted files would do, and how to use a mirror."""
    return f" (or {extracted}); for a mirror pass url=... or set {url_env(name)}"


def md5sum(path: str | os.PathLike) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path, expected_size: int | None, md5: str | None, what: str) -> None:
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise DownloadError(f"{what}: size {size:,} bytes, expected {expected_size:,} bytes")
    if md5 is not None and (got := md5sum(path)) != md5.lower():
        raise DownloadError(f"{what}: md5 {got}, expected {md5.lower()}")


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    expected_size: int | None = None,
    md5: str | None = None,
    hint: str = "",
    timeout: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download `url` to `dest` (atomically) unless `dest` already exists; verify size/md5 if given.

    A verification failure deletes the bad bytes and raises DownloadError. A network failure raises
    DownloadError naming the URL and the exact path where a manually fetched file would be used
    (`hint` adds other ways: where an extracted file would be used, how to name a mirror).
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    try:
        with atomic_path(dest) as tmp:
            _fetch(url, tmp, timeout=timeout, progress=progress)
            _verify(tmp, expected_size, md5, f"downloaded {url}")
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise DownloadError(
            f"could not download {url} ({e}). If this machine is offline, fetch that file elsewhere "
            f"and put it at {dest}{hint}."
        ) from e
    return dest


def _fetch(url: str, path: Path, *, timeout: float, progress: bool) -> None:
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(path, "wb") as f:
        total = int(resp.headers.get("Content-Length") or 0)
        done, shown = 0, -1
        while chunk := resp.read(_CHUNK):
            f.write(chunk)
            done += len(chunk)
            if progress and total and (pct := 100 * done // total) != shown:
                shown = pct
                print(f"\rdownloading {url}: {pct}%", end="", file=sys.stderr, flush=True)
        if progress and total:
            print(file=sys.stderr)
    # urllib returns a short body silently when the server hangs up early; a truncated archive
    # must never be renamed into place, so compare with the announced length ourselves.
    if total and done != total:
        raise DownloadError(f"incomplete download of {url}: got {done:,} of {total:,} bytes")


def extract_member(
    archive: str | os.PathLike, member: str, dest: str | os.PathLike, *, expected_size: int | None = None
) -> Path:
    """Extract one file of a zip archive to `dest` (atomically), checking its size if given."""
    dest = Path(dest)
    if dest.exists():
        return dest
    try:
        with zipfile.ZipFile(archive) as zf, atomic_path(dest) as tmp:
            with zf.open(member) as src, open(tmp, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            _verify(tmp, expected_size, None, f"{member} extracted from {archive}")
    except (zipfile.BadZipFile, KeyError) as e:
        raise DownloadError(
            f"cannot extract {member!r} from {archive}: {e}. Delete the archive to download it again."
        ) from e
    return dest
