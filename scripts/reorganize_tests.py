"""File tests/ by what they test: tests/ mirrors posenc_lab/ and analysis/ (tests/positional/test_fox.py tests
posenc_lab/positional/fox.py, tests/analysis/test_stats.py tests analysis/stats.py).

    python scripts/reorganize_tests.py            # reorganise, then ruff, then count
    python scripts/reorganize_tests.py --dry-run  # say what would move, change nothing

Deterministic, from the mapping below; idempotent (a second run changes nothing); tolerant: a test it does not
know stays where it is and is listed, so that the mapping can be extended.

- MOVES: a whole file that already tests one module moves with `git mv` (history follows). If its target exists
  already, its tests are merged into the target as in SPLITS.
- SPLITS: a file filed by arrival (an issue, a year) is dissolved test by test: each top-level test function or
  class goes to the file of the module it tests, with the module-level helpers, fixtures and constants it needs
  (found with `ast`, transitively; autouse fixtures go with every test). What two files need goes to the
  split's helper module; the imports each file needs are written name by name, then `ruff check --fix` and
  `ruff format` sort them.
- Imports of moved modules and names (`from tests.test_x import y`) are rewritten in every test file; so are the
  names of test files in tests/conftest.py's SLOW list, README.md, docs/, conf/, .ci/, posenc_lab/, analysis/
  and scripts/ (`tests/test_x.py` and `tests/test_x.py::test_y`).
- Nested folders get an __init__.py (tests/ is a package: modules are imported as tests.positional.test_fox);
  `Path(__file__)...parents[1]` in a file moved one folder deeper becomes `parents[2]`.
- The collected tests (default run and `-m slow`) are counted before and after; the script fails if a count
  drops or a test id disappears.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules beside it, however it is started

from reorganize_tests_mapping import SPLITS
from reorganize_tests_moves import Reorganizer
from reorganize_tests_source import ROOT, wrap_long_lines

# ---- counting ------------------------------------------------------------------------------------------------


def collect(marker: str | None) -> tuple[str, collections.Counter]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    if marker:
        cmd += ["-m", marker]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode not in (0, 5) or not lines:
        sys.exit(
            f"reorganize_tests: collecting failed ({' '.join(cmd[2:])}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        )
    ids = collections.Counter(ln.split("::", 1)[1] for ln in lines if "::" in ln)
    return lines[-1], ids


def ruff(files: list[str]) -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    files = [f for f in files if (ROOT / f).is_file() and f.endswith(".py")]
    if files:
        # format first, so that fix sees the lines format breaks; then the check that counts
        subprocess.run([exe, "check", "--fix", "--exit-zero", "-q", *files], cwd=ROOT, capture_output=True)
        subprocess.run([exe, "format", "-q", *files], cwd=ROOT, check=True)
        subprocess.run([exe, "check", "--fix", "-q", *files], cwd=ROOT)
        subprocess.run([exe, "format", "-q", *files], cwd=ROOT, check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    ap.add_argument("--no-count", action="store_true", help="skip counting the collected tests (faster)")
    args = ap.parse_args(argv)
    counts = {}
    if not args.no_count and not args.dry_run:
        counts["before"] = {m: collect(m) for m in ("not slow", "slow")}
        for m, (line, _) in counts["before"].items():
            print(f"before, -m '{m}': {line}")
    r = Reorganizer(args.dry_run)
    r.prep()
    r.packages()
    r.moves()
    for source, spec in SPLITS.items():
        r.split(source, spec)
    r.package_imports()
    r.docstrings()
    r.references()
    r.report_unmapped()
    if not args.dry_run:
        for rel in sorted(r.touched):
            if rel.endswith(".py") and (ROOT / rel).is_file():
                for _ in range(3):  # a line may need two breaks
                    if not wrap_long_lines(ROOT / rel):
                        break
        ruff(sorted(r.touched))
    for title, rows in (
        ("not in the mapping (left where they are)", r.unknown),
        ("conflicts", r.conflicts),
        ("dropped", r.dropped),
    ):
        if rows:
            print(f"\n{title}:")
            print("\n".join(f"  {row}" for row in rows))
    failed = False
    if counts:
        for m in ("not slow", "slow"):
            line, after = collect(m)
            before_line, before = counts["before"][m]
            print(f"-m '{m}': before: {before_line}\n{' ' * len(m)}      after:  {line}")
            lost = before - after
            if sum(after.values()) < sum(before.values()) or lost:
                failed = True
                print(f"  LOST: {sorted(lost)[:20]}")
    if failed:
        print("reorganize_tests: the collected tests dropped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
