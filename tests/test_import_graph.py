"""Imports run one way: no cycle among src/moebench's modules, counting the imports inside functions.

A function-level import that dodges a circular import is still a cycle (the gate once imported the
report's number format inside one_line, and the report imported the decode family's table inside a
function): a change in the upper module can break the lower one, and nobody can tell which layer is
above which. The graph is read from the source (ast), not by importing, so a lazy import counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FAMILIES = ("moebench.gemm", "moebench.allreduce", "moebench.decode")


def _modules(src: Path, top: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    out = {}
    for p in sorted((src / top).rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def import_graph(src: Path, top: str = "moebench") -> dict[str, set[str]]:
    """Module -> the modules of `top` it imports anywhere in its file (top level, inside functions and
    classes, `import a.b`, `from a import b`, `from . import b`, `from ..a import b`). `from pkg import
    name` counts the submodule pkg.name when there is one, else the package."""
    mods = _modules(src, top)

    def owner(name: str) -> str | None:  # the longest known module prefix of a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(owner(a.name) for a in node.names if a.name.split(".")[0] == top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    where = ".".join(base + ([node.module] if node.module else []))
                else:
                    where = node.module or ""
                if where.split(".")[0] != top:
                    continue
                found.update(f"{where}.{a.name}" if f"{where}.{a.name}" in mods else owner(where) for a in node.names)
        graph[mod] = {m for m in found if m is not None and m != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_within(graph, set(g), g[0]) for g in groups]


def _path_within(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """The shortest path start -> ... -> start inside one strongly connected group (breadth first)."""
    parent: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no cycle of {sorted(group)}")


def test_no_import_cycle_among_moebench_modules():
    found = cycles(import_graph(SRC))
    assert not found, "import cycles (function-level imports count):\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_gate_imports_only_the_measurement_and_no_report():
    # The gate returns numbers and reasons as data; lines and tables are made above it (moebench.outputs.report).
    # moebench.core.kinds is the measurement's own table (what a metric is bound by), importing nothing.
    assert import_graph(SRC)["moebench.baselines.compare"] <= {"moebench.core.metrics", "moebench.core.kinds"}
    assert import_graph(SRC)["moebench.core.kinds"] == set()


def test_no_baseline_module_formats_text_with_the_report():
    # The store once imported the report's fmt_pct and fmt_value to word its change lines: the gate's side
    # (every moebench.baselines module) returns numbers (EntryChange), and moebench.outputs.baseline_lines words them.
    graph = import_graph(SRC)
    formats = {m: sorted(d for d in graph[m] if d.startswith(("moebench.outputs.report", "moebench.outputs.baseline_lines")))
               for m in graph if m.startswith("moebench.baselines")}
    assert not any(formats.values()), formats
    assert "moebench.outputs.report" in graph["moebench.outputs.baseline_lines"]


# The layers, lowest first: a module imports only its own layer and the ones before it (docs/architecture.md).
LAYERS = ("core", "baselines", "results", "history", "outputs", "suite", "plugin", "cli", "__main__")
# The doors through which a generic layer reaches a family: the registries, and the command line's
# family commands (`moebench backends --family decode`, `moebench predict`).
FAMILY_DOORS = {"moebench.outputs.family_tables", "moebench.suite.family_options", "moebench.cli.main"}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a layer to a later one ('a -> b'), and every family import outside FAMILY_DOORS."""
    out = []
    for m, deps in sorted(graph.items()):
        here = _layer(m)
        if here is None:
            continue
        for d in sorted(deps):
            there = _layer(d)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                out.append(f"{m} -> {d} ({here} is below {there})")
            elif d.startswith(FAMILIES) and m not in FAMILY_DOORS:
                out.append(f"{m} -> {d} (a family, outside the registries)")
    return out


def test_each_layer_imports_only_the_layers_below_it_and_families_only_through_their_doors():
    found = layer_violations(import_graph(SRC))
    assert not found, "imports against the layers:\n" + "\n".join(found)
    assert set(_layer(m) for m in import_graph(SRC)) - {None} == set(LAYERS)  # every layer is a folder or file here


def test_the_layer_check_names_an_upward_import_and_a_family_import(tmp_path):
    src = _write(tmp_path, {
        "moebench/__init__.py": "", "moebench/core/__init__.py": "", "moebench/outputs/__init__.py": "",
        "moebench/decode/__init__.py": "", "moebench/decode/tables.py": "",
        "moebench/core/timing.py": "def f():\n    from moebench.outputs import report\n",
        "moebench/outputs/report.py": "from moebench.decode.tables import x\n",
    })
    assert layer_violations(import_graph(src)) == [
        "moebench.core.timing -> moebench.outputs.report (core is below outputs)",
        "moebench.outputs.report -> moebench.decode.tables (a family, outside the registries)"]


def test_the_plugin_knows_no_family():
    # The plugin reaches the families only through their registries (family_options, family_tables): it
    # once imported decode/options.py itself, inside pytest_addoption.
    graph = import_graph(SRC)
    assert not [d for d in graph["moebench.plugin"] if d.startswith(FAMILIES)], graph["moebench.plugin"]
    assert "moebench.decode.options" in graph["moebench.suite.family_options"]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    # The test above is only as good as its walker: a cycle closed inside a function, by a relative
    # import, or by `import a.b as x` must each be found and named.
    src = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/gate.py": "def line():\n    from pkg.report import fmt  # dodging the cycle\n",
        "pkg/report.py": "from . import results\n",
        "pkg/results.py": "from .sub import deep\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "class C:\n    def f(self):\n        import pkg.gate as g\n",
        "pkg/alone.py": "import os\nfrom pkg import sub\n",
    })
    graph = import_graph(src, "pkg")
    assert graph["pkg.gate"] == {"pkg.report"} and graph["pkg.report"] == {"pkg.results"}
    assert graph["pkg.results"] == {"pkg.sub.deep"} and graph["pkg.sub.deep"] == {"pkg.gate"}
    assert graph["pkg.alone"] == {"pkg.sub"}
    assert cycles(graph) == [["pkg.gate", "pkg.report", "pkg.results", "pkg.sub.deep", "pkg.gate"]]


def test_two_modules_importing_each_other_are_named(tmp_path):
    src = _write(tmp_path, {"pkg/__init__.py": "", "pkg/cli.py": "from pkg.cli_baselines import show\n",
                            "pkg/cli_baselines.py": "def show():\n    from pkg.cli import CliError\n"})
    assert cycles(import_graph(src, "pkg")) == [["pkg.cli", "pkg.cli_baselines", "pkg.cli"]]
