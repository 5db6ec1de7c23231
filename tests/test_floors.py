"""The floors of docs/architecture.md hold.

import-linter checks the contracts in pyproject.toml (the package's floors, the rooms of trace/ and the
order inside each, packages that must not know each other), and a module-level check finds any two modules
of bytegraph that import each other, directly or through others. Both count imports inside
function bodies too. A violation fails with the offending import named (module and line).
"""
import pathlib

import grimp
from importlinter import configuration
from importlinter.application import use_cases

import bytegraph

ROOT = pathlib.Path(bytegraph.__file__).resolve().parent.parent


def test_import_linter_contracts(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))   # lint this checkout's bytegraph, not an installed copy
    # The use case itself, not importlinter.cli.lint_imports: that one reconfigures logging for
    # the whole process (dictConfig), which would silence bytegraph's loggers in later tests.
    configuration.configure()
    passed = use_cases.lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None,
                                    no_logo=True)
    report = capsys.readouterr().out
    assert passed, report
    assert "0 broken" in report, report


def _cycles(graph, modules):
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph.find_modules_directly_imported_by(m) & modules):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def test_no_module_imports_itself_through_others(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    graph = grimp.build_graph("bytegraph", cache_dir=None)
    modules = set(graph.modules)
    assert "bytegraph.trace.callables.calls" in modules   # the graph is the real package
    cycles = _cycles(graph, modules)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append("cycle: " + ", ".join(component))
        for m in component:
            for n in sorted(graph.find_modules_directly_imported_by(m) & members):
                where = ", ".join(f"l.{d['line_number']}" for d in graph.get_import_details(importer=m, imported=n))
                lines.append(f"  {m} -> {n} ({where})")
    assert not cycles, "\n".join(lines)
