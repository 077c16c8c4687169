"""References for scripts/reorganize_tests.py: the imports, docstrings and names of test files in other files,
rewritten to where the tests now are."""

from __future__ import annotations

import ast
import re

from reorganize_tests_mapping import (
    ISSUE_IN_DOCSTRING,
    KEEP,
    MOVES,
    PHRASES,
    REFERENCE_DIRS,
    REFERENCE_SKIP,
    REFERENCE_SUFFIXES,
    SPLITS,
)
from reorganize_tests_source import ROOT, SPLITS_MODULES, TESTS, dotted, parse


class References:
    """Mixed into Reorganizer: uses its renamed, moved_tests, moved_names, primary, write() and log()."""

    def package_imports(self) -> None:
        """`from tests import test_x` (a module used as ``test_x.name``) -> the package and name it has now."""
        modules = {dotted(o): dotted(n) for o, n in self.renamed.items()}
        for path in sorted(TESTS.rglob("*.py")):
            text = path.read_text()
            tree = ast.parse(text)
            lines = text.splitlines(keepends=True)
            edits, renames = [], {}
            for node in tree.body:
                if not isinstance(node, ast.ImportFrom) or node.module is None:
                    continue
                olds = [f"{node.module}.{a.name}" for a in node.names]
                if not any(o in modules or o in SPLITS_MODULES for o in olds):
                    continue
                stmts = []
                for a, old in zip(node.names, olds):
                    alias = a.asname or a.name
                    new = modules.get(old, old)
                    if old in SPLITS_MODULES:
                        used = {
                            n.attr
                            for n in ast.walk(tree)
                            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == alias
                        }
                        homes = {self.moved_names.get((old, u)) for u in used}
                        if len(homes) != 1 or None in homes:
                            self.conflicts.append(f"{path.relative_to(ROOT)}: {old}'s names went to {homes}")
                            stmts.append(
                                f"from {node.module} import {a.name}" + (f" as {a.asname}" if a.asname else "")
                            )
                            continue
                        new = homes.pop()
                    parent, base = new.rsplit(".", 1)
                    stmts.append(f"from {parent} import {base}" + (f" as {a.asname}" if a.asname else ""))
                    if not a.asname and base != alias:
                        renames[alias] = base
                edits.append((node.lineno - 1, node.end_lineno, "".join(s + "\n" for s in stmts)))
            if not edits:
                continue
            for start, end, new in sorted(edits, reverse=True):
                lines[start:end] = [new]
            new_text = "".join(lines)
            for old, new in renames.items():
                new_text = re.sub(rf"(?<![\w.]){old}\.", f"{new}.", new_text)
            if new_text != text:
                self.write(str(path.relative_to(ROOT)), new_text)

    def docstrings(self) -> None:
        for path in sorted(TESTS.rglob("test_*.py")):
            text = path.read_text()
            mod = parse(path)
            if mod.doc is None:
                continue
            a, b = mod.doc
            doc = "".join(mod.lines[a:b])
            new = ISSUE_IN_DOCSTRING.sub("", doc)
            if new != doc:
                self.log(f"docstring: {path.relative_to(ROOT)}: issue number dropped")
                self.write(str(path.relative_to(ROOT)), text.replace(doc, new, 1))

    # -- references in other files

    def new_place(self, old: str, name: str | None) -> str | None:
        if old in self.renamed:
            new = self.renamed[old]
            while new in self.renamed:
                new = self.renamed[new]
            return new
        if old in SPLITS or old in self.primary:
            if name:
                for key in (name, *[n for (s, n) in self.moved_tests if s == old and n.startswith(name)]):
                    if (old, key) in self.moved_tests:
                        return self.moved_tests[(old, key)]
                return old if (ROOT / old).is_file() else self.primary.get(old, SPLITS[old].primary)
            return self.primary.get(old, SPLITS[old].primary if old in SPLITS else None)
        return None

    def references(self) -> None:
        refs = re.compile(r"(?<![\w/])tests/((?:\w+/)*test_\w+\.py)(?:::(\w+))?|`::(\w+)")
        rel_key = re.compile(r'"((?:\w+/)*test_\w+\.py)::(\w+)')
        dotted_ref = re.compile(r"(?<![\w.])tests\.(test_\w+)\b(?!\.py)")  # python -m tests.test_stats

        def module(m):
            new = self.new_place(f"tests/{m.group(1)}.py", None)
            return m.group(0) if new is None else dotted(new)

        files = []
        for entry in REFERENCE_DIRS:
            p = ROOT / entry
            files += [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for path in files:
            rel = str(path.relative_to(ROOT))
            if path.suffix not in REFERENCE_SUFFIXES or REFERENCE_SKIP.search(rel) or ".venv" in rel:
                continue
            if "__pycache__" in rel or path.name.startswith("reorganize_tests"):
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            out = []
            for line in text.splitlines(keepends=True):
                last = [None, None]  # (old file, new file) of the last full reference before this one

                def one(m, last=last):
                    if m.group(3):  # `::name`: a test of the file named last
                        if not last[0]:
                            return m.group(0)
                        new = self.new_place(last[0], m.group(3))
                        if new is None or new == last[1]:
                            return m.group(0)
                        return f"`{new}::{m.group(3)}"
                    old, name = "tests/" + m.group(1), m.group(2)
                    new = self.new_place(old, name)
                    last[0], last[1] = old, new or old
                    if new is None or new == old:
                        return m.group(0)
                    return new + (f"::{name}" if name else "")

                line = refs.sub(one, line)
                line = dotted_ref.sub(module, line)
                for phrase, repl in PHRASES.items():
                    line = line.replace(phrase, repl)
                if rel == "tests/conftest.py":

                    def key(m):
                        new = self.new_place("tests/" + m.group(1), m.group(2))
                        return m.group(0) if new is None else f'"{new[len("tests/") :]}::{m.group(2)}'

                    line = rel_key.sub(key, line)
                out.append(line)
            new_text = "".join(out)
            if new_text != text:
                self.log(f"references: {rel}")
                self.write(rel, new_text)

    def report_unmapped(self) -> None:
        mapped = {o for o, _ in MOVES} | {n for _, n in MOVES} | set(SPLITS) | KEEP
        mapped |= {t for s in SPLITS.values() for t in s.tests.values()}
        for path in sorted(TESTS.rglob("test_*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in mapped:
                self.unknown.append(f"{rel} (a file the mapping does not know)")
