"""Re-apply issue 36's move of trace/ into rooms to code written before it (MOVES.md).

    python scripts/rooms_reapply.py [--check] [PACKAGE_DIR]     (default: bytegraph)

Rewrites every relative import in the package that points at a module of the old flat trace/
(``from .calls import call`` in a file of trace/, ``from ..trace.frame import ...`` elsewhere),
or that only resolves from the file's old place (a file git renamed into a room keeps the
imports of trace/: ``from ..errors import ...``), to the module's new home. ``--check`` lists
the rewrites without writing. Names moved between modules are not handled: the linter
(tests/test_floors.py) and pyflakes name what is left.
"""
import ast
import pathlib
import sys

ROOMS = {
    "machine": ["opcodes", "control_opcodes", "frame", "patterns", "with_blocks"],
    "callables": ["calls", "builtin_calls", "stdlib_calls", "containers", "environ"],
    "nn": ["module_calls", "hooks", "blocks", "module_enumeration"],
    "torch_api": ["torch_calls", "torch_wrappers", "distributed", "higher_order", "pytree"],
    "python": ["lookup", "attrs", "operators", "protocols", "iteration", "generators", "exceptions"],
    "numpy_api": ["numpy_calls", "numpy_ufuncs", "numpy_conversions", "numpy_functions", "numpy_values"],
    "core": ["basics", "context", "ops", "handlers", "state"],
}
MOVED = {f"bytegraph.trace.{m}": f"bytegraph.trace.{room}.{m}" for room, ms in ROOMS.items() for m in ms}
MOVED["bytegraph.trace.environ_pytree"] = "bytegraph.trace.callables.environ"   # and torch_api.pytree


def module_name(root, path):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(package, level, module):
    base = package.split(".")
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([module] if module else []))


def relative(from_package, target):
    a, b = from_package.split("."), target.split(".")
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return "." * (len(a) - i + 1) + ".".join(b[i:])


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = pathlib.Path(args[0] if args else "bytegraph").resolve()
    paths = sorted(root.rglob("*.py"))
    existing = {module_name(root, p) for p in paths}
    changed = 0
    for path in paths:
        mod = module_name(root, path)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        if package == "bytegraph.trace" and path.stem not in ("__init__", "tracer"):
            print(f"{path}: a module of trace/ outside the rooms: git mv it into the room that owns it")
        old_package = None
        if package.startswith("bytegraph.trace.") and f"bytegraph.trace.{path.stem}" in MOVED:
            old_package = "bytegraph.trace"   # where git's rename brought it from
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        edits = []
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.ImportFrom) and node.level > 0):
                continue
            target = resolve(package, node.level, node.module)

            def place(t):
                """The module ``t`` names now, or None when it names nothing."""
                if t in existing:
                    return t
                return MOVED.get(t)

            indent = lines[node.lineno - 1][:len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
            if not node.module:
                # ``from . import a, b``: each name is a module (or a name of the package's
                # __init__); group the modules by their new package.
                def modules_of(t):
                    return {a.name: place(f"{t}.{a.name}") for a in node.names}
                found = modules_of(target)
                if not all(found.values()) and old_package is not None:
                    target = resolve(old_package, node.level, None)
                    found = modules_of(target)
                if not any(found.values()):
                    continue   # names of a package's __init__
                if not all(found.values()):
                    print(f"{path}:{node.lineno}: not every name is a module; fix by hand")
                    continue
                groups = {}
                for a in node.names:
                    groups.setdefault(found[a.name].rsplit(".", 1)[0], []).append(a)
                if list(groups) == [resolve(package, node.level, None)]:
                    continue
                new_lines = [f"{indent}from {relative(package, parent)} import "
                             + ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in names)
                             for parent, names in groups.items()]
                edits.append((node, "".join(ln + "\n" for ln in sorted(new_lines))))
                continue
            new_target = place(target)
            if new_target is None and old_package is not None:
                target = resolve(old_package, node.level, node.module)
                new_target = place(target)
            if new_target is None:
                print(f"{path}:{node.lineno}: {target} is not a module; fix by hand")
                continue
            new_prefix = f"from {relative(package, new_target)} import"
            old_prefix = "from " + "." * node.level + (node.module or "") + " import"
            if new_prefix != old_prefix:
                seg = "".join(lines[node.lineno - 1:node.end_lineno])
                edits.append((node, seg.replace(old_prefix, new_prefix, 1)))
        for node, new in edits:
            print(f"{path}:{node.lineno}: {''.join(lines[node.lineno - 1:node.end_lineno]).strip()}  ->  "
                  f"{new.strip()}")
        changed += len(edits)
        if edits and not check:
            for node, new in sorted(edits, key=lambda e: e[0].lineno, reverse=True):
                lines[node.lineno - 1:node.end_lineno] = [new]
            path.write_text("".join(lines))
    print(f"{changed} import(s) {'to rewrite' if check else 'rewritten'}")


if __name__ == "__main__":
    main(sys.argv[1:])
