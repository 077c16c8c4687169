"""The manifest of a prepared pystdlib corpus, and the modules of a fake standard library."""

import json


def _source(i: int) -> str:
    """A module of its own: lines no other module has (so no 32-byte window is shared by accident)."""
    return "".join(f"value_{i}_{k} = {i * 7919 + k * 104729}  # module {i}, line {k}\n" for k in range(i % 7 + 3))


def manifest(root):
    (path,) = (root / "pystdlib").glob("*/manifest.json")
    return json.loads(path.read_text())
