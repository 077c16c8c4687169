"""Fixtures that several test files of this folder take by name."""

import pytest

from tests.data.helpers_pystdlib import _source


@pytest.fixture
def fake_stdlib(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(60):  # 60 top-level modules, each its own family
        (root / f"mod{i}.py").write_text(_source(i))
    for i in range(3):  # a package: one family
        (root / "pkg" / f"part{i}.py").parent.mkdir(exist_ok=True)
        (root / "pkg" / f"part{i}.py").write_text(_source(100 + i))
    table = "".join(f"    {k:#06x}: {k * 31 % 65536:#06x},  # generated code table entry\n" for k in range(200))
    (root / "codec_a.py").write_text("# codec a\n" + table)  # near-duplicates in different places
    (root / "codec_b.py").write_text("# codec b, another table of the same generator\n" + table)
    for skipped in ("test/test_a.py", "site-packages/foo.py", "__pycache__/a.py", "pkg0/tests/t.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skip me\n")
    (root / "notes.txt").write_text("not python\n")
    return root
