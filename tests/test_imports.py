"""Data flows one way (docs/ARCHITECTURE.md): the import graph of posenc_lab and the analysis has no circle, the
data package imports nothing of the model, the checks or the training, and imports run down three layers: the core
of posenc_lab (training, evaluation, the run folder, the grid runner) at the bottom, the analysis (reads run folders,
writes reports) above it, and the grids' commands with the command line on top (ablate: plan -> runner -> report;
sweep and its table). Every import counts, those under ``TYPE_CHECKING`` and inside functions too: a circle hidden
from the interpreter is still one to a reader."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"posenc_lab": ROOT / "posenc_lab", "posenc_lab_analysis": ROOT / "analysis"}
# what data may import of the rest of posenc_lab: errors and file writing, which import nothing of it
DATA_MAY_IMPORT = {"posenc_lab.errors", "posenc_lab.io"}
# the top layer: the commands that run grids and write their reports, and the command line that starts them
TOP = ("posenc_lab.ablate", "posenc_lab.sweeps", "posenc_lab.cli")


def layer(module: str) -> int:
    """0: posenc_lab's core; 1: the analysis; 2: the top (``TOP``)."""
    if any(module == t or module.startswith(t + ".") for t in TOP):
        return 2
    return 1 if module.split(".")[0] == "posenc_lab_analysis" else 0


def _modules() -> dict[str, Path]:
    """module name -> file, for every module of the packages (a package by its __init__.py)."""
    out = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that ``name`` (a module or a name in one) is, or None if outside them."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the packages it imports (itself and its own package's __init__ left out)."""
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            targets |= {t for n in names if (t := _resolve(n, modules))}
        graph[module] = targets - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_package_inits(graph: dict[str, set[str]], modules: dict[str, Path]) -> dict[str, set[str]]:
    """A package's __init__ re-exports its modules: an arrow into a package stands for the module it re-exports,
    so an arrow from a module to its own package's __init__ (``from . import x``) is not a circle of the code."""
    return {
        m: {t for t in ts if not (modules[t].name == "__init__.py" and m.startswith(t + "."))}
        for m, ts in graph.items()
    }


def test_the_packages_import_graph_has_no_circle():
    modules = _modules()
    found = circles(_without_package_inits(import_graph(modules), modules))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_data_imports_nothing_of_the_model_the_checks_or_the_training():
    modules = _modules()
    graph = import_graph(modules)
    data = {m for m in modules if m.startswith("posenc_lab.data")}
    outside = {m: graph[m] - data - DATA_MAY_IMPORT for m in data if graph[m] - data - DATA_MAY_IMPORT}
    assert not outside, f"posenc_lab.data imports outside itself: {outside}"


def test_imports_run_down_the_layers_core_analysis_top():
    """The core never imports the analysis or the top, the analysis never imports the top: ablate's and sweep's
    commands call the report (and the sweep table the analysis' estimator), not the other way round."""
    graph = import_graph(_modules())
    names = ("core", "analysis", "top")
    upward = sorted(
        f"{m} ({names[layer(m)]}) -> {t} ({names[layer(t)]})"
        for m, ts in graph.items()
        for t in ts
        if layer(t) > layer(m)
    )
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)
    assert {layer(m) for m in graph} == {0, 1, 2}  # each layer has its modules: the rule is not vacuous


def test_the_checker_finds_a_circle_and_a_way_out(tmp_path):
    # the checks above must see a relative import, one inside a function and one under TYPE_CHECKING
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from p.c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "d.py").write_text("import p.a\n")
    modules = {"p": pkg / "__init__.py", **{f"p.{n}": pkg / f"{n}.py" for n in "abcd"}}
    assert circles(import_graph(modules)) == [["p.a", "p.b", "p.c"]]
