"""Cache entries per code object, newest first, and the list a wrapper scans on each call.

Many function objects can share one code object (every function a decorator wraps,
every closure a factory makes), so entries are told apart by what their guards check:
an entry whose guards match root objects by identity (``self``, a closure cell's
contents) records them as its *identity*. When several entries match the same roots,
the wrapper looks the current objects up in an index instead of trying each entry in
turn, so a decorator used on a hundred modules costs one dict lookup per call, and
``cache_size_limit`` counts recompiles per identity, not per code object.
"""
import linecache
from dataclasses import dataclass, field

from ..stacks import code_name


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

    def entries_like(self, frame_args):
        """Entries that could have served these arguments as far as identity goes: those
        matching the same root objects, and those that match none."""
        out = []
        for entry in self.entries:
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
        groups = {}
        for entry in self.entries:
            if entry.identity:
                groups.setdefault(entry.keyset, []).append(entry)
        keyed = {keyset: group for keyset, group in groups.items() if len(group) > 1}
        checks, placed = [], set()
        for entry in self.entries:
            keyset = entry.keyset if entry.identity else None
            if keyset not in keyed:
                checks.append(entry.guard)
            elif keyset not in placed:
                placed.add(keyset)
                checks.append(self._keyed_check(keyset, keyed[keyset]))
        # In place: the wrappers hold this very list.
        self.dispatch[:] = checks

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
