"""Count the imports made inside function bodies and the modules caught in import cycles.

    python scripts/import_census.py [PACKAGE_DIR] [-v]     (default: bytegraph)

An import inside a function is an import all the same (tests/test_floors.py's linter
counts it); this census is what the floors work was measured with. ``-v`` lists each
in-function import of the package's own modules.
"""
import ast
import os
import sys


def modules(root):
    """module name -> file, for every .py under ``root``."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                mod = path[:-3].replace(os.sep, ".")
                out[mod[:-len(".__init__")] if mod.endswith(".__init__") else mod] = path
    return out


def targets(mods, mod, node):
    """The modules an import statement of ``mod`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module
    if node.level:
        parts = mod.split(".") if mods[mod].endswith("__init__.py") else mod.split(".")[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def census(root):
    mods = modules(root)
    edges = {m: set() for m in mods}
    inner = []   # (module, target, line)

    def visit(mod, node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in targets(mods, mod, child):
                    if target in mods and target != mod:
                        edges[mod].add(target)
                    if in_function:
                        inner.append((mod, target, child.lineno))
            visit(mod, child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for mod, path in mods.items():
        with open(path) as f:
            visit(mod, ast.parse(f.read()), False)
    return mods, edges, inner


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    root = args[0] if args else "bytegraph"
    package = os.path.basename(os.path.normpath(root))
    mods, edges, inner = census(root)
    own = [(m, t, line) for m, t, line in inner if t.split(".")[0] == package]
    print(f"imports inside function bodies: {len(inner)} (of the package's own modules: {len(own)})")
    comps = cycles(edges)
    print(f"modules: {len(mods)}, in import cycles: {sum(map(len, comps))} {[len(c) for c in comps]}")
    if "-v" in sys.argv:
        for m, t, line in sorted(own):
            print(f"  {m}:{line} -> {t}")


if __name__ == "__main__":
    main()
