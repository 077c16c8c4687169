"""Source analysis for scripts/reorganize_tests.py: a test file's top-level items (tests, fixtures, helpers,
constants) with what each needs, and the text edits that keep a moved file valid."""

from __future__ import annotations

import ast
import collections
import re
from dataclasses import dataclass, field
from pathlib import Path

from reorganize_tests_mapping import SPLITS, TARGET

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


@dataclass
class Item:
    names: list[str]
    start: int  # 0-based line index, comments and decorators included
    end: int  # exclusive
    text: str
    refs: set[str]
    is_test: bool = False
    fixture: bool = False
    autouse: bool = False


@dataclass
class Module:
    path: Path
    lines: list[str]
    tree: ast.Module
    doc: tuple[int, int] | None = None
    future: bool = False
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # bound name -> (statement, comment)
    import_end: int = 0  # line after the last top-level import
    items: list[Item] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def defined(self) -> dict[str, Item]:
        return {n: it for it in self.items for n in it.names}


def _refs(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)  # a parameter names a fixture
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out |= set(TARGET.findall(n.value))  # `_target_=tests.test_x.Name`: a callback Hydra imports
    return out


def _is_fixture(node) -> tuple[bool, bool]:
    for d in getattr(node, "decorator_list", []):
        src = ast.unparse(d)
        if src.startswith(("pytest.fixture", "fixture")):
            return True, "autouse=True" in src
    return False, False


def parse(path: Path) -> Module:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    mod = Module(path, lines, tree)
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        mod.doc = (body[0].lineno - 1, body[0].end_lineno)
        body = body[1:]
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            mod.future = True
            mod.import_end = node.end_lineno
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            comment = ""
            last = lines[node.end_lineno - 1]
            if "#" in last:
                comment = last[last.index("#") :].strip()
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if isinstance(node, ast.Import):
                    stmt = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                else:
                    stmt = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                    stmt += f" as {alias.asname}" if alias.asname else ""
                mod.imports[bound] = (stmt, comment)
            if not mod.items:
                mod.import_end = node.end_lineno
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):  # comments right above belong to it
            start -= 1
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            mod.other.append("".join(lines[node.lineno - 1 : node.end_lineno]))
            continue
        fixture, autouse = _is_fixture(node)
        is_test = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
        is_test |= isinstance(node, ast.ClassDef) and node.name.startswith("Test")
        mod.items.append(
            Item(
                names,
                start,
                node.end_lineno,
                "".join(lines[start : node.end_lineno]),
                _refs(node) - set(names),
                is_test,
                fixture,
                autouse,
            )
        )
    return mod


def closure(mod: Module, item: Item) -> list[Item]:
    """The module-level items ``item`` needs, transitively (autouse fixtures included for a test)."""
    defined = mod.defined()
    seen, todo = [], [item]
    if item.is_test:
        todo += [it for it in mod.items if it.autouse]
    while todo:
        it = todo.pop()
        if any(it is s for s in seen):
            continue
        seen.append(it)
        todo += [defined[r] for r in sorted(it.refs) if r in defined and not defined[r].is_test]
    return seen


def dotted(rel: str) -> str:
    return rel[: -len(".py")].replace("/", ".")


SPLITS_MODULES = {dotted(k) for k in SPLITS}


def depth(rel: str) -> int:
    return rel.count("/") - 1  # tests/x.py: 0


def shift_paths(text: str, delta: int) -> str:
    """Path(__file__)'s repository root and tests/data, seen from a file ``delta`` folders deeper."""
    if delta == 0:
        return text
    text = re.sub(
        r"Path\(__file__\)\.resolve\(\)\.parents\[(\d)\]",
        lambda m: f"Path(__file__).resolve().parents[{int(m.group(1)) + delta}]",
        text,
    )
    text = text.replace("Path(__file__).resolve().parent.parent", f"Path(__file__).resolve().parents[{1 + delta}]")
    return text.replace('Path(__file__).parent / "data"', f'Path(__file__).parents[{delta}] / "data"')


def wrap_long_lines(path: Path, width: int = 120) -> bool:
    """Lines a longer test path made too long: a comment or docstring line breaks at a space, a string literal
    in code splits in two (implicit concatenation). Other long lines are left to ruff to report."""
    import io
    import tokenize

    text = path.read_text()
    if all(len(ln) <= width for ln in text.splitlines()):
        return False
    lines = text.splitlines(keepends=True)
    kinds, strings = {}, collections.defaultdict(list)  # line -> "comment" / "doc"; line -> [(start, end)]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            kinds[tok.start[0]] = "comment"
        elif tok.type == tokenize.STRING:
            if tok.string.endswith(('"""', "'''")) and len(tok.string) >= 6:
                for n in range(tok.start[0], tok.end[0] + 1):
                    kinds.setdefault(n, "doc")
            elif tok.start[0] == tok.end[0] and tok.string[0] in "\"'":
                strings[tok.start[0]].append((tok.start[1], tok.end[1]))
    out = []
    for n, line in enumerate(lines, 1):
        body = line.rstrip("\n")
        indent = body[: len(body) - len(body.lstrip())]
        if len(body) <= width:
            out.append(line)
        elif kinds.get(n) in ("comment", "doc"):
            cut = body.rfind(" ", len(indent) + 1, width)
            if cut <= len(indent):
                out.append(line)
                continue
            lead = "# " if kinds[n] == "comment" and body.lstrip().startswith("#") else ""
            out.append(body[:cut] + "\n" + indent + lead + body[cut + 1 :] + "\n")
        else:
            # the last string literal that starts before the limit, cut at a space, or else at a _ or /
            for a, b in sorted(strings.get(n, []), reverse=True):
                lo, hi = a + 8, min(width - 1, b - 8)
                cut = -1
                for sep in (" ", "_", "/"):
                    cut = body.rfind(sep, lo, hi)
                    if cut >= 0:
                        cut += 1
                        break
                if cut > 0:
                    q = body[a]
                    out.append(body[:cut] + q + "\n" + indent + q + body[cut:] + "\n")
                    break
            else:
                out.append(line)
    new = "".join(out)
    if new != text:
        path.write_text(new)
        return True
    return False


def _body(items: list[Item], delta: int) -> str:
    body = ""
    for prev, it in zip([None, *items], items):  # constants side by side as they stood, defs two lines apart
        together = (
            prev is not None and prev.end == it.start and not prev.text.lstrip().startswith(("def", "class", "@"))
        )
        body += ("" if prev is None or together else "\n\n") + shift_paths(it.text.rstrip("\n"), delta) + "\n"
    return body


def _bound(stmt: str) -> str:
    stmt = stmt.split("#")[0].strip()
    if " as " in stmt:
        return stmt.rsplit(" as ", 1)[1]
    if stmt.startswith("import "):
        return stmt[len("import ") :].split(".")[0]
    return stmt.rsplit(" import ", 1)[1]


def _loaded(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree))


def _split_at_line(text: str, line: int) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:line]), "".join(lines[line:])
