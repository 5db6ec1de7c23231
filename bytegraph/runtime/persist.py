"""The persistent cache: compiled frames saved on disk and used again by a later process.

What is saved (one file per cache entry, under ``config.cache_dir``/<frame key>/):

* the **guards**, in a portable form: sources as data; an identity guard on a module as "a
  module of this class", on a parameter or buffer as "a tensor of this dtype/device/shape/
  requires_grad", on anything else (functions, classes, modules) as a reference pickle must
  give back the very same object in any process; other guards with their expected values;
* the **graph**: its nodes (targets by reference), the source of each placeholder and of each
  parameter or buffer it reads;
* the **transformed function**'s Python source and the objects it names (by reference);
* **fingerprints** of the code it ran: every code object the trace ran (the hash of its source
  file; for functions reachable by their qualified name, the hash of the code found there now).

The frame key covers the function's code, the Python, torch and bytegraph versions (bytegraph
as a hash of its own source files), the backend (by name, with its mode and options) and the
settings that change what is traced. On a miss, before tracing, ``load`` tries the saved
entries of the frame: it reads every source on the new call's arguments, checks the portable
guards (class of each module, metadata of each parameter, identity of referenced objects),
then builds guards with this process's objects, rebuilds the graph over this process's
parameters, compiles it with the backend (Inductor then hits its own FX graph cache) and
makes the transformed function. Any check that fails, any file that cannot be read, is of
another format, or was written by other versions is passed over (logged under the ``cache``
topic); the frame is then traced as usual.

Saved only: frames traced whole (no graph break, no eager fallback) by a named backend, with
static shapes, whose every guard, graph target and named object is portable, and whose trace
relied on nothing true in this process only (``tx.process_local``: set order of strings,
``lru_cache`` results, ``hash()``; ``tx.unguarded_reads``). Writes go to a temporary file
renamed into place, so concurrent writers and readers never see half a file.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import pickle
import re
import sys
import tempfile
import types

import torch
import torch.compiler._cache as _cache
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ..backends.regions import global_state_kept
from ..config import config
from ..debug import logs
from ..guards import builder as g
from ..guards.kinds import kind_named
from ..guards.stamps import EPOCH
from .fingerprints import NotPortable, bytegraph_hash as _bytegraph_hash, code_fingerprints as _code_fingerprints, \
    code_hash as _code_hash, fingerprints_hold as _fingerprints_hold
from ..guards.sources import (AttrSource, BuiltinSource, ClosureSource, DefaultSource, GlobalSource, ItemSource,
                              LocalSource, ModuleEntrySource, ObjectSource)

FORMAT = 2
log = logs.get_logger("cache")
_SUFFIX = ".bgentry"


def frame_key(fn: types.FunctionType, compiler) -> str | None:
    """The key of ``fn``'s frames under ``compiler``, or None when they are not saved."""
    if compiler.backend_spec is None:
        return None
    name, mode, options = compiler.backend_spec
    try:
        spec = repr((name, mode, sorted((options or {}).items())))
    except TypeError:
        return None
    code = fn.__code__
    parts = (FORMAT, sys.version, torch.__version__, _bytegraph_hash(), fn.__module__, code.co_qualname,
             code.co_filename, _code_hash(code), spec, compiler.fullgraph, compiler.dynamic,
             config.dynamic_shapes)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


# --- portable forms ---------------------------------------------------------------------------

def _ref(obj):
    """``obj`` named for another process: a module by its name, anything else pickled by
    reference; checked to come back as the very same object."""
    if isinstance(obj, types.ModuleType):
        name = getattr(obj, "__name__", None)
        if isinstance(name, str) and sys.modules.get(name) is obj:
            return ("module", name)
        raise NotPortable(f"module {obj!r} is not importable by its name")
    try:
        data = pickle.dumps(obj, protocol=4)
        back = pickle.loads(data)
    except Exception as e:
        raise NotPortable(f"{type(obj).__name__} {obj!r} cannot be named in another process ({e})") from None
    if back is not obj:
        raise NotPortable(f"{type(obj).__name__} {obj!r} is not the same object when loaded")
    return ("pickle", data)


def _deref(ref):
    kind, data = ref
    if kind == "module":
        module = sys.modules.get(data)
        if module is None:
            raise NotPortable(f"module {data} is not imported")
        return module
    return pickle.loads(data)


def _value(v):
    """A constant pickled by value, checked to come back equal and of the same type."""
    try:
        data = pickle.dumps(v, protocol=4)
        back = pickle.loads(data)
    except Exception as e:
        raise NotPortable(f"{type(v).__name__} value cannot be saved ({e})") from None
    if type(back) is not type(v) or not (back == v or (back != back and v != v)):
        raise NotPortable(f"{type(v).__name__} value does not come back equal")
    return data


def _source_out(s):
    if isinstance(s, LocalSource):
        return ("local", s.local)
    if isinstance(s, GlobalSource):
        return ("global", s.global_name)
    if isinstance(s, BuiltinSource):
        return ("builtin", s.builtin_name)
    if isinstance(s, ClosureSource):
        return ("closure", s.index, s.var)
    if isinstance(s, AttrSource):
        return ("attr", _source_out(s.base), s.attr)
    if isinstance(s, ModuleEntrySource):
        return ("entry", _source_out(s.base), s.table, s.key)
    if isinstance(s, ItemSource):
        _value(s.index)
        return ("item", _source_out(s.base), s.index)
    if isinstance(s, DefaultSource):
        return ("default", _source_out(s.base), s.index, s.kw)
    if isinstance(s, ObjectSource):
        if isinstance(s.obj, type):
            return ("class", _ref(s.obj), s.label)
        module = _globals_module(s.obj)
        if module is None:
            raise NotPortable(f"source {s.name()} is not portable")
        return ("globals_of", module, s.label)
    raise NotPortable(f"source {type(s).__name__} is not portable")


def _globals_module(obj):
    if isinstance(obj, dict):
        name = obj.get("__name__")
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is not None and module.__dict__ is obj:
            return name
    return None


def _source_in(t):
    kind = t[0]
    if kind == "local":
        return LocalSource(t[1])
    if kind == "global":
        return GlobalSource(t[1])
    if kind == "builtin":
        return BuiltinSource(t[1])
    if kind == "closure":
        return ClosureSource(t[1], t[2])
    if kind == "attr":
        return AttrSource(_source_in(t[1]), t[2])
    if kind == "entry":
        return ModuleEntrySource(_source_in(t[1]), t[2], t[3])
    if kind == "item":
        return ItemSource(_source_in(t[1]), t[2])
    if kind == "default":
        return DefaultSource(_source_in(t[1]), t[2], t[3])
    if kind == "globals_of":
        module = sys.modules.get(t[1])
        if module is None:
            raise NotPortable(f"module {t[1]} is not imported")
        return ObjectSource(module.__dict__, t[2])
    if kind == "class":
        return ObjectSource(_deref(t[1]), t[2])
    raise NotPortable(f"unknown source kind {kind!r}")


def _meta_out(t):
    return (_ref(type(t)), str(t.dtype), str(t.device), tuple(t.shape), tuple(t.stride()), t.requires_grad)


def _meta_matches(obj, saved):
    cls, dtype, device, shape, stride, requires_grad = saved
    return (isinstance(obj, torch.Tensor) and type(obj) is _deref(cls) and str(obj.dtype) == dtype
            and str(obj.device) == device and tuple(obj.shape) == shape and tuple(obj.stride()) == stride
            and obj.requires_grad == requires_grad)


def _identity_out(expected):
    if expected is None:
        return ("none",)
    if isinstance(expected, torch.nn.Module):
        return ("module", _ref(type(expected)))
    if isinstance(expected, torch.Tensor):
        return ("tensor", _meta_out(expected))
    if isinstance(expected, types.CodeType):
        return ("code", _code_hash(expected))
    if isinstance(expected, types.FunctionType):
        # Named by reference, a function is whatever the name holds when read back: in this
        # process that can be another function (``A.helper = f`` after saving). Its code and
        # defaults say whether it is still the one traced.
        return ("function", _ref(expected), _code_hash(expected.__code__),
                _value((expected.__defaults__, expected.__kwdefaults__)))
    return ("ref", _ref(expected))


def _tensor_meta_out(guard):
    if guard.dynamic_dims:
        raise NotPortable("symbolic sizes")
    t = guard.expected
    return ("tensor_meta", (_ref(t.cls), str(t.dtype), str(t.device), t.shape, t.stride, t.requires_grad,
                            t.contiguous))


# How a guard's ``expected`` is written, by its kind's ``persisted_as`` (guards.kinds).
_EXPECTED_OUT = {
    "identity": lambda guard: _identity_out(guard.expected),
    "ref": lambda guard: ("ref", _ref(guard.expected)),
    "value": lambda guard: ("value", _value(guard.expected)),
    "keys": lambda guard: ("value", _value(list(guard.expected))),
    "tensor_meta": _tensor_meta_out,
    "source": lambda guard: ("source", _source_out(guard.expected)),
    "storage": lambda guard: ("storage", _source_out(guard.expected[0]), bool(guard.expected[1])),
    "none": lambda guard: ("none",),
}


def _guard_out(guard):
    kind, source = guard.kind, guard.source
    src = _source_out(source) if source is not None else None
    write = _EXPECTED_OUT.get(kind.persisted_as)
    if write is None:
        raise NotPortable(f"{kind} guards are not portable")
    return (str(kind), src, write(guard), guard.detail)


class _NodeRef:
    """A graph node named in a saved node's arguments."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (_NodeRef, (self.name,))


def _graph_out(gm, builder):
    nodes = []
    for n in gm.graph.nodes:
        args = fx.node.map_arg(n.args, lambda a: _NodeRef(a.name))
        kwargs = fx.node.map_arg(n.kwargs, lambda a: _NodeRef(a.name))
        if n.op == "call_function":
            target = ("ref", _ref(n.target))
        else:
            target = ("name", n.target)
        try:
            data = pickle.dumps((args, kwargs), protocol=4)
        except Exception as e:
            raise NotPortable(f"arguments of {n.name} cannot be saved ({e})") from None
        nodes.append((n.op, n.name, target, data, n.meta.get("bytegraph_region")))
    inputs = [_source_out(i.source) for i in builder.inputs]
    state = {name: (_source_out(src), is_param) for name, (src, is_param) in builder.state_sources.items()}
    return {"nodes": nodes, "inputs": inputs, "state": state}


_SKIP_NAMES = {"__builtins__", "G", "torch", "__compiled_fn"}


def _namespace_out(run):
    out = {}
    for name, obj in run.__globals__.items():
        if name in _SKIP_NAMES or obj is run:
            continue
        module = _globals_module(obj)
        if module is not None:
            out[name] = ("globals_of", module)
        elif isinstance(obj, (int, float, str, bytes, bool, type(None), tuple, frozenset, torch.dtype, torch.device)):
            out[name] = ("value", _value(obj))
        else:
            out[name] = ("ref", _ref(obj))
    return out


# --- saving -------------------------------------------------------------------------------

def save(fn: types.FunctionType, compiler, tx, entry, builder, graph) -> None:
    """Write ``entry`` (a whole frame just compiled) to the cache, if it can be carried."""
    if not config.persistent_cache:
        return
    key = frame_key(fn, compiler)
    if key is None:
        return
    try:
        if tx.process_local or tx.unguarded_reads:
            raise NotPortable("the trace relied on facts true in this process only")
        if tx.graph.shapes.has_symbols:
            raise NotPortable("symbolic sizes")
        if tx.graph.function_subclass_inputs:
            # The graph must run with subclass __torch_function__ off (codegen wraps it).
            raise NotPortable("__torch_function__ subclass inputs")
        if any(n.op == "get_attr" and not isinstance(getattr(tx.graph.state_root, n.target, None),
                                                    (torch.Tensor, torch.nn.Module))
               for n in tx.graph.graph.nodes):
            raise NotPortable("an object held by reference (a DeviceMesh)")
        codes = dict(tx.inlined_codes)
        codes[fn.__code__] = fn.__module__
        record = {
            "format": FORMAT, "key": key, "python": sys.version, "torch": torch.__version__,
            "bytegraph": _bytegraph_hash(),
            "name": fn.__qualname__,
            "guards": [_guard_out(gd) for gd in entry.guards],
            "graph": _graph_out(graph, builder) if graph is not None else None,
            "transformed": (entry.run.__name__, entry.transformed_source, _namespace_out(entry.run)),
            "fingerprints": _code_fingerprints(codes),
        }
        data = pickle.dumps(record, protocol=4)
    except NotPortable as e:
        log.debug("not saving %s to the persistent cache: %s", fn.__qualname__, e)
        return
    except Exception as e:   # never fail a compile because of the cache
        log.debug("not saving %s to the persistent cache: %s: %s", fn.__qualname__, type(e).__name__, e)
        return
    directory = os.path.join(config.cache_dir, key)
    path = os.path.join(directory, hashlib.sha256(data).hexdigest()[:32] + _SUFFIX)
    if not _write_entry(directory, path, data):
        return
    _loaded.setdefault((config.cache_dir, key), {})[path] = record
    _record_artifact(key, path, data)
    log.debug("saved %s to %s", fn.__qualname__, path)


def _write_entry(directory, path, data):
    """Write one entry file (through a temporary file renamed into place); False if it cannot be."""
    try:
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(path):
            return True
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)   # atomic: readers see the whole file or none
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        log.debug("cannot write the persistent cache at %s: %s", directory, e)
        return False
    return True


# --- torch.compiler.save_cache_artifacts / load_cache_artifacts -------------------------------
#
# torch gathers what its caches wrote or used in a process ("mega-cache" artifacts, one type per
# cache) and serializes them on save_cache_artifacts(); load_cache_artifacts(bytes) in another
# process hands each one back to its cache. Entries of this cache are one type among them, so the
# bytes torch's own functions give carry bytegraph's compiled frames along with Inductor's and
# AOTAutograd's caches, with or without patch_torch_compile.

ARTIFACT_TYPE = "bytegraph"


class _Artifact(_cache.CacheArtifact):
    """One saved entry: ``key`` is "<frame key>/<file name>", ``content`` the file's bytes."""

    @staticmethod
    def type():
        return ARTIFACT_TYPE

    def populate_cache(self):
        frame_key, _, name = self.key.partition("/")
        if not (re.fullmatch(r"[0-9a-f]{32}", frame_key) and re.fullmatch(r"[0-9a-f]{32}" + re.escape(_SUFFIX), name)):
            log.debug("ignoring a cache artifact with a malformed name: %r", self.key)
            return
        _write_entry(os.path.join(config.cache_dir, frame_key), os.path.join(config.cache_dir, frame_key, name),
                     self.content)


if ARTIFACT_TYPE not in _cache.CacheArtifactFactory._artifact_types:
    _cache.CacheArtifactFactory.register(_Artifact)


def _record_artifact(key, path, data):
    try:
        _cache.CacheArtifactManager.record_artifact(ARTIFACT_TYPE, f"{key}/{os.path.basename(path)}", data)
    except Exception as e:   # noqa: BLE001 - never fail a compile because of the artifact list
        log.debug("cache artifact not recorded: %s: %s", type(e).__name__, e)


# --- loading ------------------------------------------------------------------------------

_loaded = {}     # (cache dir, key) -> {path: record or None}: files read in this process


def _records(key):
    known = _loaded.setdefault((config.cache_dir, key), {})
    directory = os.path.join(config.cache_dir, key)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in sorted(names):
        if not name.endswith(_SUFFIX) or name.startswith(".tmp-"):
            continue
        path = os.path.join(directory, name)
        if path in known:
            continue
        try:
            with open(path, "rb") as f:
                record = pickle.load(f)
            if not isinstance(record, dict) or record.get("format") != FORMAT:
                raise ValueError("not an entry of this format")
        except Exception as e:
            log.debug("ignoring unreadable persistent cache file %s: %s: %s", path, type(e).__name__, e)
            known[path] = None
            continue
        if (record.get("key"), record.get("python"), record.get("torch"), record.get("bytegraph")) != \
                (key, sys.version, torch.__version__, _bytegraph_hash()):
            log.debug("ignoring stale persistent cache file %s", path)
            known[path] = None
            continue
        known[path] = record
    return [(path, r) for path, r in known.items() if r is not None]


class _Resolver:
    """Reads sources on one call's arguments."""

    def __init__(self, fn, params, values):
        self.fn = fn
        self.locals = dict(zip(params, values))
        self.memo = {}

    def __call__(self, s):
        if s in self.memo:
            return self.memo[s]
        if isinstance(s, LocalSource):
            obj = self.locals[s.local]
        elif isinstance(s, GlobalSource):
            obj = self.fn.__globals__[s.global_name]
        elif isinstance(s, BuiltinSource):
            obj = __builtins__[s.builtin_name] if isinstance(__builtins__, dict) else getattr(__builtins__,
                                                                                              s.builtin_name)
        elif isinstance(s, ClosureSource):
            obj = self.fn.__closure__[s.index].cell_contents
        elif isinstance(s, AttrSource):
            obj = getattr(self(s.base), s.attr)
        elif isinstance(s, ModuleEntrySource):
            obj = self(s.base).__dict__[s.table][s.key]
        elif isinstance(s, ItemSource):
            obj = self(s.base)[s.index]
        elif isinstance(s, DefaultSource):
            base = self(s.base)
            obj = base.__kwdefaults__[s.index] if s.kw else base.__defaults__[s.index]
        elif isinstance(s, ObjectSource):
            obj = s.obj
        else:
            raise NotPortable(f"cannot read {s.name()}")
        self.memo[s] = obj
        return obj


def load(c, values: list) -> tuple | None:
    """(guards, run, transformed source, graph) for this call from the persistent cache, or None."""
    if not config.persistent_cache:
        return None
    fn = c.fn
    key = frame_key(fn, c.compiler)
    if key is None:
        return None
    for path, record in _records(key):
        try:
            entry = _instantiate(c, values, record)
        except NotPortable as e:
            log.debug("a saved entry of %s does not apply: %s", fn.__qualname__, e)
            continue
        except Exception as e:
            log.debug("a saved entry of %s cannot be used: %s: %s", fn.__qualname__, type(e).__name__, e)
            continue
        if entry is not None:
            log.debug("%s loaded from the persistent cache", fn.__qualname__)
            try:
                with open(path, "rb") as f:
                    _record_artifact(key, path, f.read())
            except OSError:
                pass
            return entry
    return None


def _closure_args(fn):
    return (fn.__closure__,) if fn.__code__.co_freevars else ()


def _instantiate(c, values, record):
    """(guards, run, transformed source, graph) for this call from a saved record."""
    fn = c.fn
    why = _fingerprints_hold(record["fingerprints"])
    if why is not None:
        raise NotPortable(why)
    resolve = _Resolver(fn, c.params, values)
    guards = g.GuardSet()
    guards.epoch = -1     # the first check runs the detailed guards too
    for name, src, exp, detail in record["guards"]:
        kind = kind_named(name)
        source = _source_in(src) if src is not None else None
        expected = _expected_in(kind, source, exp, resolve)
        if source is not None:
            try:
                obj = resolve(source)
            except Exception:
                pass
            else:
                if not isinstance(obj, (int, float, str, bool, type(None))):
                    guards.objects[source] = obj
        guards.add(kind, source, expected, detail)
    for guard in guards:
        if not _holds(guard, resolve):
            raise NotPortable(f"guard fails: {guard.describe()}")
    # The graph over this process's parameters, compiled by the backend.
    ns = {"G": fn.__globals__, "torch": torch}
    gm = None
    if record["graph"] is not None:
        gm, example_inputs = _graph_in(record["graph"], resolve)
        if c.compiler.backend_name != "eager":
            _propagate_fakes(gm, example_inputs)
        ns["__compiled_fn"] = c.compile_graph(gm, example_inputs)
    name, source, names = record["transformed"]
    for nm, (kind, data) in names.items():
        if kind == "globals_of":
            module = sys.modules.get(data)
            if module is None:
                raise NotPortable(f"module {data} is not imported")
            ns[nm] = module.__dict__
        elif kind == "ref":
            ns[nm] = _deref(data)
        else:
            ns[nm] = pickle.loads(data)
    new_name = c.transformed_name()
    source = re.sub(rf"^def {re.escape(name)}\(", f"def {new_name}(", source, count=1)
    filename = f"<bytegraph {new_name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    guards.epoch = EPOCH[0]   # checked just now
    return guards, ns[new_name], source, gm


def _holds(guard, resolve):
    """Does ``guard`` hold on this call (read through ``resolve``)? Identity guards were checked
    as they were read back (``_expected_in``)."""
    if guard.kind.pins:
        return True
    return guard.kind.evaluate(guard, resolve)


def _expected_in(kind, source, exp, resolve):
    tag = exp[0]
    if kind.persisted_as == "identity":
        obj = resolve(source)
        if tag == "none":
            if obj is not None:
                raise NotPortable(f"{source.name()} is not None")
            return None
        if tag == "module":
            if type(obj) is not _deref(exp[1]):
                raise NotPortable(f"{source.name()} is a {type(obj).__name__} now")
            return obj
        if tag == "tensor":
            if not _meta_matches(obj, exp[1]):
                raise NotPortable(f"{source.name()} is another kind of tensor now")
            return obj
        if tag == "code":
            if not isinstance(obj, types.CodeType) or _code_hash(obj) != exp[1]:
                raise NotPortable(f"{source.name()} is other code now")
            return obj
        expected = _deref(exp[1])
        if tag == "function" and not (isinstance(expected, types.FunctionType)
                                      and _code_hash(expected.__code__) == exp[2]
                                      and (expected.__defaults__, expected.__kwdefaults__) == pickle.loads(exp[3])):
            raise NotPortable(f"{source.name()} is another function now")
        if obj is not expected:
            raise NotPortable(f"{source.name()} is another object now")
        return expected
    if tag == "ref":
        return _deref(exp[1])
    if tag == "value":
        return pickle.loads(exp[1])
    if tag == "tensor_meta":
        cls, dtype, device, shape, stride, requires_grad, contiguous = exp[1]
        meta = g.TensorMeta.__new__(g.TensorMeta)
        meta.cls = _deref(cls)
        meta.dtype = getattr(torch, dtype.split(".")[-1])
        meta.device = torch.device(device)
        meta.shape, meta.stride, meta.requires_grad, meta.contiguous = shape, stride, requires_grad, contiguous
        return meta
    if tag == "source":
        return _source_in(exp[1])
    if tag == "storage":
        return (_source_in(exp[1]), exp[2])
    if tag == "none":
        return None
    raise NotPortable(f"unknown guard form {tag!r}")


def state_module(state):
    """A module holding a graph's state: ``{name: (tensor, is a parameter)}``."""
    root = torch.nn.Module()
    for name, (tensor, is_param) in state.items():
        if is_param:
            root.register_parameter(name, tensor)
        else:
            root.register_buffer(name, tensor)
    return root


def _graph_in(saved, resolve):
    root = state_module({name: (resolve(_source_in(src)), is_param)
                         for name, (src, is_param) in saved["state"].items()})
    graph = fx.Graph()
    env = {}
    for op, name, (tkind, tdata), data, region in saved["nodes"]:
        target = _deref(tdata) if tkind == "ref" else tdata
        args, kwargs = pickle.loads(data)
        args = _map_refs(args, env)
        kwargs = _map_refs(kwargs, env)
        if op == "output":
            env[name] = graph.output(args[0])
        else:
            node = graph.create_node(op, target, args, kwargs, name=name)
            if node.name != name:
                raise NotPortable("graph names do not come back")
            if region is not None:
                node.meta["bytegraph_region"] = region   # backends/regions.py splits there
            env[name] = node
    gm = fx.GraphModule(root, graph)
    example_inputs = [resolve(_source_in(s)) for s in saved["inputs"]]
    return gm, example_inputs


def _map_refs(obj, env):
    if isinstance(obj, _NodeRef):
        return env[obj.name]
    if isinstance(obj, tuple):
        return tuple(_map_refs(x, env) for x in obj)
    if isinstance(obj, list):
        return [_map_refs(x, env) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_refs(v, env) for k, v in obj.items()}
    if isinstance(obj, slice):
        return slice(_map_refs(obj.start, env), _map_refs(obj.stop, env), _map_refs(obj.step, env))
    return obj


def _propagate_fakes(gm, example_inputs):
    """Fake values on every node (backends read them: gradients' reach, regions). The graph's
    grad-mode and autocast nodes run too: the state is put back after, so the backend compiles
    the graph under the state its frame starts in (a resume function that leaves a `with
    torch.autocast` block was compiled without autocast, and its matmuls failed on mixed dtypes)."""
    with global_state_kept(gm):
        _propagate(gm, example_inputs)


def _propagate(gm, example_inputs):
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=ShapeEnv())
    env = {}
    inputs = iter(example_inputs)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            value = mode.from_tensor(next(inputs), static_shapes=True)
        elif n.op == "get_attr":
            value = mode.from_tensor(getattr(gm, n.target), static_shapes=True)
        elif n.op == "output":
            continue
        else:
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            with mode:
                if n.op == "call_method":
                    value = getattr(args[0], n.target)(*args[1:], **kwargs)
                else:
                    value = n.target(*args, **kwargs)
        env[n] = value
        n.meta["example_value"] = value


__all__ = ["save", "load", "frame_key"]
