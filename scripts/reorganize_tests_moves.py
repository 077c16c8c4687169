"""The moves of scripts/reorganize_tests.py: whole files with git mv, issue- and year-named files test by test."""

from __future__ import annotations

import ast
import collections
import re
import subprocess
from pathlib import Path

from reorganize_tests_mapping import DOCS, MOVES, PREP, SPLITS, Split
from reorganize_tests_refs import References
from reorganize_tests_source import (
    ROOT,
    TESTS,
    _body,
    _bound,
    _loaded,
    _split_at_line,
    closure,
    depth,
    dotted,
    parse,
    shift_paths,
)


class Reorganizer(References):
    def __init__(self, dry: bool):
        self.dry = dry
        self.touched: set[str] = set()
        self.renamed: dict[str, str] = {}  # old file -> new file (whole moves)
        self.moved_tests: dict[tuple[str, str], str] = {}  # (old file, test) -> new file
        self.moved_names: dict[tuple[str, str], str] = {}  # (old module, name) -> new module (helpers)
        self.primary: dict[str, str] = {}
        self.unknown: list[str] = []
        self.conflicts: list[str] = []
        self.dropped: list[str] = []

    def log(self, msg: str) -> None:
        print(msg)

    def git(self, *args: str) -> None:
        if not self.dry:
            subprocess.run(["git", *args], cwd=ROOT, check=True)

    def write(self, rel: str, text: str) -> None:
        self.touched.add(rel)
        if not self.dry:
            (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            (ROOT / rel).write_text(text)

    # -- steps

    def prep(self) -> None:
        for rel, old, new in PREP:
            p = ROOT / rel
            if p.is_file() and old in p.read_text():
                self.log(f"prep: {rel}: {old.splitlines()[0]} -> {new.splitlines()[0]}")
                self.write(rel, p.read_text().replace(old, new))

    def packages(self) -> None:
        for rel in sorted({str(Path(t).parent) for _, t in MOVES} | self._split_targets()):
            d = ROOT / rel
            while d != TESTS and TESTS in d.parents:
                init = d / "__init__.py"
                if not init.exists():
                    self.log(f"package: {init.relative_to(ROOT)}")
                    if not self.dry:
                        d.mkdir(parents=True, exist_ok=True)
                        init.write_text("")
                    self.touched.add(str(init.relative_to(ROOT)))
                d = d.parent

    def _split_targets(self) -> set[str]:
        return {str(Path(t).parent) for s in SPLITS.values() for t in [*s.tests.values(), s.helpers]}

    def moves(self) -> None:
        for old, new in MOVES:
            if not (ROOT / old).is_file():
                continue
            if (ROOT / new).exists():
                self.log(f"merge: {old} -> {new}")
                mod = parse(ROOT / old)
                tests = {n: new for it in mod.items if it.is_test for n in it.names}
                self.split(old, Split(helpers=new, tests=tests, primary=new))
                continue
            self.log(f"git mv {old} {new}")
            self.git("mv", old, new)
            self.renamed[old] = new
            if not self.dry:
                path = ROOT / new
                text = shift_paths(path.read_text(), depth(new) - depth(old))
                if new in DOCS and text.startswith('"""'):
                    text = f'"""{DOCS[new]}\n\n' + text[3:]
                path.write_text(text)
            self.touched.add(new)
            self.rewrite_module_imports({dotted(old): dotted(new)})

    def rewrite_module_imports(self, modules: dict[str, str]) -> None:
        if self.dry:
            return
        for path in sorted(TESTS.rglob("*.py")):
            text = path.read_text()
            new = text
            for old, repl in modules.items():
                new = re.sub(rf"\b{re.escape(old)}\b(?=\s+import\b|\s*$|\s+as\b|\.[A-Za-z_])", repl, new, flags=re.M)
            if new != text:
                path.write_text(new)
                self.touched.add(str(path.relative_to(ROOT)))

    def split(self, source: str, spec: Split) -> None:
        src = ROOT / source
        if not src.is_file():
            return
        self.primary[source] = spec.primary
        mod = parse(src)
        src_mod = dotted(source)
        # who imports what from this file
        external: dict[str, set[str]] = collections.defaultdict(set)
        for path in sorted(TESTS.rglob("*.py")):
            if path == src:
                continue
            tree = ast.parse(path.read_text())
            aliases = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == src_mod:
                    for a in node.names:
                        external[a.name].add(str(path.relative_to(ROOT)))
                if isinstance(node, ast.ImportFrom):
                    aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" == src_mod}
            for node in ast.walk(tree):  # `from tests import test_x` then `test_x.name`
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    external[node.attr].add(str(path.relative_to(ROOT)))
        # where each test goes
        dest_of: dict[int, str] = {}
        for i, it in enumerate(mod.items):
            if it.is_test:
                target = spec.tests.get(it.names[0])
                if target is None:
                    self.unknown.append(f"{source}::{it.names[0]}")
                    target = source
                dest_of[i] = target
        users: dict[int, set[str]] = collections.defaultdict(set)
        index = {id(it): i for i, it in enumerate(mod.items)}
        for i, d in dest_of.items():
            for dep in closure(mod, mod.items[i]):
                if not dep.is_test:
                    users[index[id(dep)]].add(d)
        for i, it in enumerate(mod.items):
            if not it.is_test and any(n in external for n in it.names):
                users[i].add("<external>")
                for dep in closure(mod, it):
                    users[index[id(dep)]].add("<external>")
        for i, it in enumerate(mod.items):
            if it.is_test:
                continue
            u = users.get(i, set())
            if not u:
                dest_of[i] = source if source in dest_of.values() else ""
                if not dest_of[i]:
                    self.dropped.append(f"{source}: {', '.join(it.names)} (used by no test)")
            elif len(u) == 1 and "<external>" not in u:
                dest_of[i] = next(iter(u))
            elif it.fixture and not it.autouse and not Path(spec.helpers).name.startswith("test_"):
                dest_of[i] = str(Path(spec.helpers).parent / "conftest.py")  # found by name, no import
            else:
                dest_of[i] = spec.helpers
        # conflicts: a name the target defines otherwise, or imports from elsewhere
        by_dest: dict[str, list[int]] = collections.defaultdict(list)
        for i, d in dest_of.items():
            if d and d != source:
                by_dest[d].append(i)
        refused: set[str] = set()
        for d, idx in by_dest.items():
            if not (ROOT / d).is_file():
                continue
            there = parse(ROOT / d)
            defined = {n: it.text for it in there.items for n in it.names}
            for i in idx:
                it = mod.items[i]
                for n in it.names:
                    if n in defined and defined[n].strip() != it.text.strip():
                        refused.add(d)
                        self.conflicts.append(f"{source}::{n} -> {d}: {d} has another {n}")
                    elif n in there.imports and there.imports[n][0] != mod.imports.get(n, ("",))[0]:
                        refused.add(d)
                        self.conflicts.append(f"{source}::{n} -> {d}: {d} imports another {n}")
        for i, d in list(dest_of.items()):
            if d in refused:
                dest_of[i] = source
                for dep in closure(mod, mod.items[i]):  # what it needs stays with it
                    j = index[id(dep)]
                    if dest_of.get(j) not in (source, spec.helpers):
                        dest_of[j] = source
        if refused:
            by_dest = collections.defaultdict(list)
            for i, d in dest_of.items():
                if d and d != source:
                    by_dest[d].append(i)
        staying = [i for i, d in dest_of.items() if d == source]
        leaves = not any(mod.items[i].is_test for i in staying)
        helper_names = {n for i, d in dest_of.items() if d == spec.helpers for n in mod.items[i].names}
        helper_mod = dotted(spec.helpers)
        for d, idx in sorted(by_dest.items()):
            items = [mod.items[i] for i in sorted(idx, key=lambda i: mod.items[i].start)]
            for it in items:
                if it.is_test:
                    self.moved_tests[(source, it.names[0])] = d
                    self.log(f"  {source}::{it.names[0]} -> {d}")
            needed = set()
            for it in items:
                for dep in closure(mod, it):
                    if dep.is_test and dep is not it:
                        continue
                    needed |= dep.refs
                    if dep.autouse and d != spec.helpers:
                        needed |= set(dep.names)
            local = {n for it in items for n in it.names}
            from_helpers = sorted((needed & helper_names) - local) if d != spec.helpers else []
            self.insert(d, source, mod, items, needed - local, from_helpers, helper_mod)
        for n in helper_names:
            self.moved_names[(src_mod, n)] = helper_mod
        for i, d in dest_of.items():
            if d.endswith("/conftest.py"):
                for n in mod.items[i].names:
                    self.moved_names[(src_mod, n)] = "<conftest>" + str(Path(d).parent)
        # the source: what stays, or nothing
        if leaves:
            self.log(f"git rm {source}")
            self.git("rm", "-q", "-f", source)
            self.touched.discard(source)
        else:
            moved = sorted((set(by_dest and [i for v in by_dest.values() for i in v])), reverse=True)
            lines = list(mod.lines)
            for i in moved:
                it = mod.items[i]
                del lines[it.start : it.end]
            text = "".join(lines)
            # a section's heading comment whose tests all left goes too
            text = re.sub(r"^# -{3,}.*\n\s*(?=^# -{3,}|\Z)", "", text, flags=re.M)
            text = re.sub(r"^# -{3,}.*\n\s*(?=^# -{3,}|\Z)", "", text, flags=re.M)
            text = re.sub(r"\n{3,}", "\n\n\n", text)
            need = set().union(*(mod.items[i].refs for i in staying)) if staying else set()
            back = sorted((need | {n for i in staying for n in mod.items[i].names}) & helper_names)
            if back:
                stmt = "\n".join(f"from {helper_mod} import {n}" for n in back) + "\n"
                head, tail = _split_at_line(text, mod.import_end)
                text = head + stmt + tail
            self.write(source, text)
        self.rewrite_name_imports(src_mod)

    def insert(self, dest, source, mod, items, needed, from_helpers, helper_mod) -> None:
        delta = depth(dest) - depth(source)
        autouse = {n for it in mod.items if it.autouse for n in it.names}
        imports = []
        for name in sorted(needed):
            if name in mod.imports:
                stmt, comment = mod.imports[name]
                # a noqa stays only with the names the source never reads (fixtures imported for their name)
                keep = comment if "noqa" in comment and not _loaded(mod.tree, name) else ""
                imports.append(stmt + (f"  {keep}" if keep else ""))
        for name in from_helpers:
            note = "  # noqa: F401 - an autouse fixture" if name in autouse else ""
            imports.append(f"from {helper_mod} import {name}{note}")
        path = ROOT / dest
        own = dotted(dest)
        imports = [s for s in imports if not s.startswith(f"from {own} import ")]
        if path.is_file():
            there = parse(path)
            same = {n: it.text.strip() for it in there.items for n in it.names}
            items = [it for it in items if any(same.get(n) != it.text.strip() for n in it.names)]
            if not items:
                return
            imports = [s for s in imports if _bound(s) not in there.imports and _bound(s) not in same]
            text = path.read_text() if not self.dry else "".join(there.lines)
            head, tail = _split_at_line(text, there.import_end)
            if imports:
                head += "\n".join(imports) + "\n"
            text = head + tail
            text = text.rstrip("\n") + "\n\n\n" + _body(items, delta)
        else:
            doc = DOCS.get(dest) or (
                SPLITS[source].helpers_doc if dest == SPLITS.get(source, Split("", {}, "")).helpers else ""
            )
            if not doc and dest.endswith("/conftest.py"):
                doc = "Fixtures that several test files of this folder take by name."
            if not doc:
                doc = f"Tests of what {Path(dest).stem[len('test_') :]} does."
            text = f'"""{doc}"""\n\n'
            if mod.future:
                text += "from __future__ import annotations\n\n"
            text += "\n".join(imports) + "\n\n\n" + _body(items, delta)
        self.write(dest, text)

    def rewrite_name_imports(self, src_mod: str) -> None:
        """`from tests.<split file> import a, b` -> from the modules a and b now live in."""
        for path in sorted(TESTS.rglob("*.py")):
            if not path.is_file():
                continue
            text = path.read_text()
            tree = ast.parse(text)
            lines = text.splitlines(keepends=True)
            edits = []
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module == src_mod):
                    continue
                last = lines[node.end_lineno - 1]
                comment = ("  " + last[last.index("#") :].strip()) if "#" in last else ""
                indent = lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
                groups = collections.defaultdict(list)
                for a in node.names:
                    target = self.moved_names.get((src_mod, a.name))
                    if target and target.startswith("<conftest>"):  # a fixture conftest.py now gives by name
                        if not str(path).startswith(str(ROOT / target[len("<conftest>") :]) + "/"):
                            self.conflicts.append(f"{path.relative_to(ROOT)}: {a.name} is in {target[10:]}/conftest.py")
                        continue
                    if target is None:
                        target = dotted(self.moved_tests.get((f"{src_mod.replace('.', '/')}.py", a.name), ""))
                    groups[target or src_mod].append(a.name + (f" as {a.asname}" if a.asname else ""))
                new = "".join(f"{indent}from {m} import {', '.join(ns)}{comment}\n" for m, ns in groups.items())
                edits.append((node.lineno - 1, node.end_lineno, new))
            for start, end, new in sorted(edits, reverse=True):
                lines[start:end] = [new]

            def target(m):  # `_target_=tests.<split file>.Name` in a string: where Name lives now
                where = self.moved_names.get((src_mod, m.group(1))) or dotted(
                    self.moved_tests.get((f"{src_mod.replace('.', '/')}.py", m.group(1)), src_mod + ".py")
                )
                return f"{where}.{m.group(1)}"

            new_text = re.sub(rf"\b{re.escape(src_mod)}\.([A-Za-z_]\w*)", target, "".join(lines))
            if new_text != "".join(lines):
                lines = [new_text]
                edits.append(None)
            if edits and "".join(lines) != text:
                self.write(str(path.relative_to(ROOT)), "".join(lines))
