"""The README's reliability section is a list of promises, each naming the tests that hold it: every promise
names at least one test, and every test named exists (a renamed or deleted test breaks the promise here, not
silently)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Reliability"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _section(text: str, title: str) -> str:
    start = text.index(title + "\n")
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else len(text)]


def _promises() -> list[tuple[str, list[tuple[str, str]]]]:
    """The section's table rows: (promise, [(file, test), ...])."""
    rows = []
    for line in _section((ROOT / "README.md").read_text(), SECTION).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 2 and not set(cells[1]) <= set("-: ") and cells[1] != "held by":
            rows.append((cells[0], TEST_REF.findall(cells[1])))
    return rows


def _test_names(path: Path) -> set[str]:
    return {
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def test_every_reliability_promise_names_tests_that_exist():
    rows = _promises()
    assert len(rows) >= 15, f"the reliability table has {len(rows)} rows; did its format change?"
    for promise, refs in rows:
        assert refs, f"the promise {promise!r} names no test"
        for file, name in refs:
            assert (ROOT / file).is_file(), f"{promise!r}: {file} does not exist"
            assert name in _test_names(ROOT / file), f"{promise!r}: {file} has no test {name}"


def test_the_checker_reads_a_row_and_refuses_a_missing_test(tmp_path):
    # The parser above must find references in a row, and _test_names must not find a test that is not there;
    # otherwise the check above would pass on anything.
    row = "| a promise | `tests/test_readme.py::test_every_reliability_promise_names_tests_that_exist` |"
    assert TEST_REF.findall(row) == [("tests/test_readme.py", "test_every_reliability_promise_names_tests_that_exist")]
    assert "test_not_there" not in _test_names(Path(__file__))
