"""Cache entries per code object, newest first, and the list a wrapper scans on each call.

Many function objects can share one code object (every function a decorator wraps,
every closure a factory makes), so entries are told apart by what their guards check:
an entry whose guards match root objects by identity (``self``, a closure cell's
contents) records them as its *identity*. When several entries match the same roots,
the wrapper looks the current objects up in an index instead of trying each entry in
turn, so a decorator used on a hundred modules costs one dict lookup per call, and
``cache_size_limit`` counts recompiles per identity, not per code object.

What the list holds also follows the compiler's stance (``stance.py``): nothing under
``force_eager`` (every call misses, and the miss runs the original code), only the entries of
the forced backend under ``force_backend``, and checks of the differentiating guards only under
``skip_guard_eval_unsafe``; ``refresh`` rebuilds it when the stance changes.
"""
import linecache
from dataclasses import dataclass, field

import torch

from ..guards.builder import (GLOBAL_STATE, NDARRAY_MATCH, SHAPE_ENV, TENSOR_MATCH, GuardSet, compile_guards)
from ..stacks import code_name
from . import stance


@dataclass
class CacheEntry:
    guard: object             # guard(*frame_args) -> ``run`` when the entry applies, else None
    run: object               # run(*frame_args) -> result (transformed function, or the original)
    explain: object           # explain(*frame_args) -> str | None (first failing guard)
    guards: list              # the Guard records, for listings
    graph: object = None      # the fx.GraphModule handed to the backend (None: no graph)
    transformed_source: str = ""
    guard_source: str = ""
    fallback_reason: str = None   # set when this entry runs the frame eagerly
    identity: tuple = ()      # ((source, object), ...): root objects the guards match by identity
    backend: object = None    # the backend it was compiled with under set_stance(force_backend=...)
    template: object = None   # reuse.Template: the entry made again for other modules of its structure

    @property
    def keyset(self):
        return tuple(source for source, _ in self.identity)


@dataclass
class CodeCache:
    """Everything cached for one code object (and globals) under one compile() call."""
    code: object
    globals: dict = None
    params: tuple = ()                                  # the generated functions' parameters
    entries: list = field(default_factory=list)        # CacheEntry, newest first
    dispatch: list = field(default_factory=list)       # what wrappers scan: guard functions
    eager_forever: bool = False
    recompile_reasons: list = field(default_factory=list)
    warned: bool = False
    auto_dynamic: dict = field(default_factory=dict)          # source -> dims whose size changed
    auto_dynamic_scalars: set = field(default_factory=set)    # int sources whose value changed
    _key_readers: dict = field(default_factory=dict)          # keyset -> reader(*args) -> objects
    wrapper_factories: dict = field(default_factory=dict)     # which parameters have defaults -> factory
    first_call: object = None     # set_stance("eager_then_compile"): what the eager first call was given
    top_level: bool = False       # a function handed to compile() runs this code (not only routed calls)
    resumes: bool = False         # the code of a resume function (a break hands over to it)
    _unsafe: tuple = None         # (entries, checks) under skip_guard_eval_unsafe

    def add(self, entry):
        self.entries.insert(0, entry)
        self._rebuild_dispatch()

    def clear(self):
        self.entries.clear()
        self.dispatch.clear()
        self.eager_forever = False
        self.recompile_reasons.clear()
        self.warned = False
        self.auto_dynamic.clear()
        self.auto_dynamic_scalars.clear()
        self.first_call = None
        self._unsafe = None

    def refresh(self):
        """Rebuild the dispatch list (the stance changed)."""
        self._rebuild_dispatch()

    def current_entries(self):
        """The entries the current stance may run: those compiled with the backend it forces, or
        (no backend forced) with the compiler's own."""
        forced = stance.current[0].force_backend
        return [e for e in self.entries if e.backend == forced]

    def entries_like(self, frame_args, entries=None):
        """Entries (of ``entries``, default all) that could have served these arguments as far as
        identity goes: those matching the same root objects, and those that match none."""
        out = []
        for entry in self.entries if entries is None else entries:
            if not entry.identity:
                out.append(entry)
                continue
            current = self.key_reader(entry.keyset)(*frame_args)
            if current is not None and all(a is b for a, b in zip(current, (o for _, o in entry.identity))):
                out.append(entry)
        return out

    def key_reader(self, keyset):
        """A generated function returning the objects at ``keyset``'s sources (None if unreadable)."""
        reader = self._key_readers.get(keyset)
        if reader is None:
            reader = self._key_readers[keyset] = _generate(
                self, "key_of", ["    try:", f"        return ({_tuple(s.expr() for s in keyset)})",
                                 "    except Exception:", "        return None"], {})
        return reader

    def _rebuild_dispatch(self):
        now = stance.current[0]
        if now.changes_hits:
            if now.name == "force_eager":
                checks = []
            elif now.skip_guard_eval_unsafe:
                checks = self._unsafe_checks(self.current_entries())
            else:
                checks = [e.guard for e in self.current_entries()]
            self.dispatch[:] = checks
            return
        groups = {}
        for entry in self.entries:
            if entry.backend is not None:
                continue
            if entry.identity:
                groups.setdefault(entry.keyset, []).append(entry)
        keyed = {keyset: group for keyset, group in groups.items() if len(group) > 1}
        checks, placed = [], set()
        for entry in self.entries:
            if entry.backend is not None:
                continue
            keyset = entry.keyset if entry.identity else None
            if keyset not in keyed:
                checks.append(entry.guard)
            elif keyset not in placed:
                placed.add(keyset)
                checks.append(self._keyed_check(keyset, keyed[keyset]))
        # In place: the wrappers hold this very list.
        self.dispatch[:] = checks

    def _unsafe_checks(self, entries):
        """Checks for ``set_stance(skip_guard_eval_unsafe=True)``: each entry's guards on tensor
        metadata (not parameters), symbolic sizes and global state, and those of its other guards
        that tell it apart from the code's other entries (missing in one, or expecting another
        value); torch.compile's "differentiating guards"."""
        if self._unsafe is not None and self._unsafe[0] == [id(e) for e in entries]:
            return self._unsafe[1]
        seen = [{_guard_key(g): g.expected for g in e.guards} for e in entries]
        differing = set()
        for keys in seen:
            for key, expected in keys.items():
                if any(key not in other or not _same_expected(other[key], expected) for other in seen):
                    differing.add(key)
        checks = []
        for i, entry in enumerate(entries):
            kept = GuardSet()
            for g in entry.guards:
                if _guard_key(g) in differing or g.kind in (GLOBAL_STATE, SHAPE_ENV, NDARRAY_MATCH) \
                        or (g.kind == TENSOR_MATCH and g.expected.cls is not torch.nn.Parameter):
                    kept.add(g.kind, g.source, g.expected, g.detail, g.dynamic_dims)
            label = code_name(self.code)
            check, _, _ = compile_guards(kept, list(self.params), self.globals,
                                         name=f"unsafe_guard_{label if label.isidentifier() else 'code'}_{i}",
                                         hit=entry.run)
            checks.append(check)
        self._unsafe = ([id(e) for e in entries], checks)
        return checks

    def _keyed_check(self, keyset, group):
        index = {}
        for entry in group:   # newest first, as the flat list would try them
            index.setdefault(tuple(id(o) for _, o in entry.identity), []).append(entry.guard)
        args = ", ".join(self.params)
        body = ["    try:", f"        __key = ({_tuple(f'id({s.expr()})' for s in keyset)})",
                "    except Exception:", "        return None",
                "    for __check in __index.get(__key, ()):",
                f"        __run = __check({args})",
                "        if __run is not None:", "            return __run", "    return None"]
        return _generate(self, "dispatch_by_identity", body, {"__index": index})


def _guard_key(g):
    # One source can carry several guards of a kind that names an attribute (MISSING_ATTR...).
    return g.kind, g.source, g.detail, g.expected if isinstance(g.expected, str) else None


def _same_expected(a, b):
    if a is b:
        return True
    slots = getattr(type(a), "__slots__", None)
    if slots and type(a) is type(b):    # guards.builder.TensorMeta, ArrayMeta: field by field
        return all(_same_expected(getattr(a, n, None), getattr(b, n, None)) for n in slots)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:   # noqa: BLE001 - values that cannot be compared are told apart
        return False


def _tuple(parts):
    parts = list(parts)
    return ", ".join(parts) + ("," if len(parts) == 1 else "")


_generated = [0]


def _generate(cache, what, body, ns):
    _generated[0] += 1
    label = code_name(cache.code)
    name = f"{what}_{label if label.isidentifier() else 'code'}_{_generated[0]}"
    src = f"def {name}({', '.join(cache.params)}):\n" + "\n".join(body) + "\n"
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = dict(ns, G=cache.globals)
    exec(compile(src, filename, "exec"), ns)
    return ns[name]
