"""The README is a landing page, and the pages it links hold the rest; these tests keep both honest.

- The README gives the two commands for a fresh machine (the same as the install page's and as what .ci/run
  runs) and the main job's time and machine, and names no date outside a link, nor a machine outside the quick
  start (measurements live in benchmarks/results/, reached by links).
- docs/RELIABILITY.md is a list of promises, each naming the tests that hold it: every promise names at least
  one test, and every test named exists (a renamed or deleted test breaks the promise here, not silently).
- Every relative link of the README and of the documentation pages points to a file that exists (the CI's
  `mkdocs build --strict` also checks anchors and the site's own links); docs/hooks.py, which brings the pages
  outside docs/ into the site, rewrites their links as the site sees them.
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RELIABILITY = ROOT / "docs" / "RELIABILITY.md"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]'"
COMMANDS = [f"{SETUP} && posenc-lab ablate", f"{SETUP} && python -m pytest"]
# the pages of the site (mkdocs.yml, docs/hooks.py), and the records' pages, read on the repository's host
PAGES = [
    README,
    ROOT / "analysis" / "README.md",
    ROOT / "conf" / "experiment" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "results" / "LOG.md",
    *sorted((ROOT / "benchmarks" / "results").glob("*/README.md")),
]


def _promises() -> list[tuple[str, list[tuple[str, str]]]]:
    """The reliability table's rows: (promise, [(file, test), ...])."""
    rows = []
    for line in RELIABILITY.read_text().splitlines():
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


def _links(markdown: str) -> list[str]:
    """The targets of the inline links and images of ``markdown``, outside fenced code."""
    return LINK.findall(FENCE.sub("", markdown))


def _broken(page: Path) -> list[str]:
    """The relative links of ``page`` whose file does not exist."""
    out = []
    for target in _links(page.read_text()):
        path = target.partition("#")[0]
        if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path) and not (page.parent / path).exists():
            out.append(target)
    return out


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


def test_the_readme_is_a_landing_page_without_dates_or_machines():
    text = README.read_text()
    for title in ("## Quick start", "## A result", "## Schemes", "## Presets", "## Documentation", "## Architecture"):
        assert f"\n{title}\n" in text, f"README.md has no section {title!r}"
    prose = LINK.sub("", text)  # link targets (benchmarks/results/<date>_...) may carry dates; the text may not
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", prose)
    # the main job's time and machine, in the quick start only: every other figure says where it ran on its own page
    quick_start = re.search(r"\n## Quick start\n(.*?)\n## ", prose, re.S).group(1)
    assert re.search(r"about \d+ minutes on a 2-core CPU", quick_start)
    assert not re.findall(r"EPYC|Xeon|H100|H200|A100|AMX|\d-core", prose.replace(quick_start, ""))
    assert "[Measured](benchmarks/results/" in text  # the one place that says where and when the result was measured


def test_the_two_commands_are_the_install_pages_and_what_ci_runs():
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert block and block.group(1).splitlines() == COMMANDS
    usage = (ROOT / "docs" / "USAGE.md").read_text()
    assert all(c in usage for c in COMMANDS)  # the install page gives the same two commands
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [s.strip() for s in SETUP.split("&&")[2:]] + ["python -m pytest"]  # after the venv .ci/run makes
    lines = [line.strip() for line in ci.splitlines()]
    assert all(any(line.startswith(s) for line in lines) for s in steps), f"{steps} not all in .ci/run"


def test_every_relative_link_of_the_pages_points_to_a_file():
    assert len(PAGES) >= 12 and all(p.is_file() for p in PAGES)
    broken = {str(p.relative_to(ROOT)): b for p in PAGES if (b := _broken(p))}
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_link_checker_finds_a_broken_link_and_skips_code_and_urls(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("")
    page.write_text(
        "[ok](there.md#a) ![img](there.md) [gone](gone.md#b) [web](https://example.org/x.md) [self](#c)\n"
        "```bash\n[not a link](in_code.md)\n```\n"
    )
    assert _broken(page) == ["gone.md#b"]


def _hooks():
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_hook_writes_each_link_as_the_site_sees_it():
    hooks = _hooks()
    readme = (
        "[u](docs/USAGE.md#install) [a](analysis/README.md) [t](tests/test_readme.py) [l](benchmarks/results/LOG.md) "
        "`[c](docs/x.md)` [g](docs/GONE.md) [w](https://example.org) [r](benchmarks/results/default/default_report.md)"
    )
    assert hooks.rewrite(readme, "README.md") == (
        "[u](USAGE.md#install) [a](analysis/README.md) t (`tests/test_readme.py`) l (`benchmarks/results/LOG.md`) "
        "`[c](docs/x.md)` [g](GONE.md) [w](https://example.org) [r](RESULTS.md)"
    )  # a missing page stays a link, which the strict build names; code is left as written
    assert hooks.rewrite("[`tests/test_readme.py`](tests/test_readme.py)", "README.md") == "`tests/test_readme.py`"
    analysis = "[s](../docs/SCHEMES.md#xl) [r](../README.md) [p](../conf/experiment/README.md) [m](stats.py)"
    assert hooks.rewrite(analysis, "analysis/README.md") == (
        "[s](../SCHEMES.md#xl) [r](../index.md) [p](../conf/experiment/README.md) m (`analysis/stats.py`)"
    )
    assert hooks.rewrite("[r](../../README.md)\n```\n[k](../x.md)\n```\n", "docs/guide/PAGE.md") == (
        "[r](../index.md)\n```\n[k](../x.md)\n```\n"
    )
    # the Results page: its figures kept beside it are served with it; a figure the record did not keep is its text
    report = f"{hooks.RESULTS}/default_report.md"
    figure = next(r for r in hooks.OUTSIDE if r.endswith(".png"))
    kept = figure[len(hooks.RESULTS) + 1 :]
    assert hooks.rewrite(f"![kept]({kept}) ![gone](nowhere/gone.png)", report) == (f"![kept](results/{kept}) gone")


def test_the_scheme_table_is_rendered_from_the_registry_with_every_scheme_and_preset():
    hooks = _hooks()
    from posenc_lab.positional import SCHEMES

    table = hooks.scheme_table()
    names = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert names == sorted(p.stem for p in (ROOT / "conf" / "posenc").glob("*.yaml"))
    assert set(SCHEMES) <= set(names)
    rows = dict(zip(names, table.splitlines()[2:]))
    assert "`(q+u).k + (q+v).W_R R_{i-j}`" in rows["xl"] and "a preset of `hybrid`" in rows["irope"]
    assert all(row.count(" | ") == 4 for row in rows.values())  # five cells: no '|' of a formula split a row
    page = (ROOT / "docs" / "SCHEMES.md").read_text()
    assert hooks.SCHEME_TABLE in page and "## Every scheme" in page


def test_every_schemes_snippet_builds_the_model_its_command_trains():
    """The site's snippet of each scheme of conf/posenc/: its Python builds a model that runs a segment with memory,
    and its command line composes a valid config whose model is that same model (scheme, options, memory)."""
    import torch

    from posenc_lab.build import model_config
    from posenc_lab.checks import problems
    from posenc_lab.compose import Composer

    hooks = _hooks()
    names = sorted(p.stem for p in (ROOT / "conf" / "posenc").glob("*.yaml"))
    with Composer() as composer:
        for name in names:
            command, python = hooks.scheme_snippet(name, composer)
            built: dict = {}
            exec(python, built)  # as a user pastes it
            config, model = built["config"], built["model"]
            L = hooks.SNIPPET_LENGTHS["segment_len"]
            tokens = torch.randint(0, config.vocab_size, (2, L))
            first = model(tokens, tokens)
            second = model(tokens, tokens, mems=first.mems)
            assert torch.isfinite(second.loss) and second.mems[0].shape[1] == config.mem_len, name
            words = command.split()
            assert words[:3] == ["posenc-lab", "train", f"posenc={name}"], command
            cfg = composer.compose(words[2:])
            assert problems(cfg, "train") == [], (name, problems(cfg, "train"))
            trained = model_config(cfg, config.vocab_size)
            assert (trained.posenc, trained.mem_len) == (config.posenc, config.mem_len), name
            left_out = {k for k, v in trained.posenc_kwargs.items() if v is None}  # the scheme's own default
            assert {k: v for k, v in trained.posenc_kwargs.items() if k not in left_out} == config.posenc_kwargs, name
    page = (ROOT / "docs" / "SCHEMES.md").read_text()
    assert hooks.SCHEME_SNIPPETS in page and f"**`{names[0]}`**" in hooks.scheme_snippets()


def test_the_preset_table_is_rendered_from_conf_experiment():
    hooks = _hooks()
    table = hooks.preset_table()
    names = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert names == sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    rows = dict(zip(names, table.splitlines()[2:]))
    assert (
        "`posenc-lab ablate experiment=zoo`" in rows["zoo"] and "`posenc-lab train experiment=recall`" in rows["recall"]
    )
    assert "every registered positional scheme" in rows["zoo"]  # its opening comment's first sentence
    assert hooks.PRESET_TABLE in (ROOT / "conf" / "experiment" / "README.md").read_text()
