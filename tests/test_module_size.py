"""The house keeps every module of posenc_lab/ and analysis/ under 450 lines: a module that grows past that holds
more than one concern, and one of them moves out (as report.py's worker processes moved to workers.py)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 450
PACKAGES = ("posenc_lab", "analysis")


def too_long(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """path (relative to ``root``) -> line count, for every .py file of PACKAGES over ``limit`` lines."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > limit:
                out[str(path.relative_to(root))] = n
    return out


def test_no_module_is_over_450_lines():
    assert not too_long(ROOT), f"modules over {LIMIT} lines (move a concern out): {too_long(ROOT)}"


def test_the_count_finds_a_long_module_anywhere_in_the_packages(tmp_path):
    # the check above must see nested modules and count lines as `wc -l` does, or it would pass on anything
    nested = tmp_path / "analysis" / "sections" / "long.py"
    nested.parent.mkdir(parents=True)
    nested.write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "posenc_lab").mkdir()
    (tmp_path / "posenc_lab" / "short.py").write_text("x = 1\n" * LIMIT)
    assert too_long(tmp_path) == {"analysis/sections/long.py": LIMIT + 1}
