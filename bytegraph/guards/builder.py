"""Guards: the Python facts a trace relied on, compiled into one function.

The tracer records guards as it reads values from their sources. At the end
of a trace ``compile_guards`` generates two functions over the frame's
arguments:

* ``check(*frame_args)``: straight-line code, cheapest checks first, shared
  sub-expressions read once; returns True when the cache entry may be used.
* ``explain(*frame_args)``: the same checks one at a time; returns the first
  failure in the user's terms ("size of x (dim 0): expected 4, got 8").
"""
import builtins
import linecache
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .sources import GlobalSource, ObjectSource, Source

# Guard kinds, in the order their checks are emitted.
GLOBAL_STATE = "GLOBAL_STATE"
ID_MATCH = "ID_MATCH"
TYPE_MATCH = "TYPE_MATCH"
CONSTANT_MATCH = "CONSTANT_MATCH"
LENGTH_MATCH = "LENGTH_MATCH"
DICT_KEYS = "DICT_KEYS"
TENSOR_MATCH = "TENSOR_MATCH"
ALIAS = "ALIAS"   # two sources named the same object when traced
SHAPE_ENV = "SHAPE_ENV"   # relations between symbolic sizes (expected: graph.shapes.Shapes)
STATE_MATCH = "STATE_MATCH"   # an object's __dict__ equals a snapshot (the object is deep-copied)
NO_HOOKS = "NO_HOOKS"   # an nn.Module called while tracing had no forward hooks
NOT_ALIAS = "NOT_ALIAS"   # two sources named different objects when traced (`is`, id(), or one is mutated)
STORAGE_SHARED = "STORAGE_SHARED"   # two tensor inputs of a graph that mutates: share storage or not
MISSING_ATTR = "MISSING_ATTR"   # the object had no attribute ``expected`` (hasattr, except AttributeError)


class TensorMeta:
    """What a TENSOR_MATCH guard remembers of a tensor (not the tensor: it must not stay alive)."""
    __slots__ = ("cls", "dtype", "device", "shape", "stride", "requires_grad", "contiguous")

    def __init__(self, t):
        self.cls = type(t)
        self.dtype = t.dtype
        self.device = t.device
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.requires_grad = t.requires_grad
        self.contiguous = t.is_contiguous()

    def dim(self):
        return len(self.shape)


@dataclass
class Guard:
    kind: str
    source: Source          # None for GLOBAL_STATE
    expected: object        # what the trace saw
    detail: str = ""        # for GLOBAL_STATE: which piece of state
    dynamic_dims: tuple = ()  # for TENSOR_MATCH: dims whose size is symbolic (checked by shape guards)

    def describe(self):
        where = self.source.name() if self.source is not None else self.detail
        if self.kind == TENSOR_MATCH:
            t = self.expected
            size = [("*" if d in self.dynamic_dims else n) for d, n in enumerate(t.shape)]
            stride = "contiguous" if self.dynamic_dims else list(t.stride)
            return (f"{where}: TENSOR_MATCH {t.cls.__name__} {t.dtype} {t.device} "
                    f"size={size} stride={stride} requires_grad={t.requires_grad}")
        if self.kind == SHAPE_ENV:
            return "symbolic shapes: " + "; ".join(desc for _, desc in self.expected.guards(lambda s: s.name()))
        if self.kind == ID_MATCH:
            return f"{where}: ID_MATCH {_short(self.expected)}"
        if self.kind == TYPE_MATCH:
            return f"{where}: TYPE_MATCH {self.expected.__qualname__}"
        if self.kind == GLOBAL_STATE:
            return f"{self.detail}: {self.expected[1]!r}"
        if self.kind == ALIAS:
            return f"{where}: is {self.expected.name()}"
        if self.kind == NOT_ALIAS:
            return f"{where}: is not {self.expected.name()}"
        if self.kind == STORAGE_SHARED:
            return f"{where}: {'shares' if self.expected[1] else 'shares no'} storage with {self.expected[0].name()}"
        return f"{where}: {self.kind} {self.expected!r}"


def _short(obj):
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name:
        return f"{type(obj).__name__} {name}"
    return f"{type(obj).__name__} at 0x{id(obj):x}"


class GuardSet:
    """Guards collected during one trace, deduplicated, in insertion order."""

    def __init__(self):
        self._guards = {}

    def add(self, kind, source, expected, detail="", dynamic_dims=()):
        key = (kind, source, detail)
        if key not in self._guards:
            self._guards[key] = Guard(kind, source, expected, detail, tuple(dynamic_dims))

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self):
        return len(self._guards)


# --- global state -----------------------------------------------------------

def global_state_snapshot():
    """(detail, expression, current value) for every piece of global state a graph depends on."""
    return [
        ("grad mode", "_is_grad_enabled()", torch.is_grad_enabled()),
        ("default dtype", "_get_default_dtype()", torch.get_default_dtype()),
        ("autocast (cpu)", "_autocast_enabled('cpu')", torch.is_autocast_enabled("cpu")),
        ("autocast (cuda)", "_autocast_enabled('cuda')", torch.is_autocast_enabled("cuda")),
        ("inference mode", "_inference_mode()", torch.is_inference_mode_enabled()),
    ]


def process_group_state():
    """(rank, world size, group name) in the default process group; None before
    ``init_process_group`` (what traced ``dist.get_rank()`` and friends were read from)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.group.WORLD
    return dist.get_rank(), dist.get_world_size(), world.group_name


def add_process_group_guard(guards):
    """The trace read the default process group (its rank, size or name) as constants."""
    guards.add(GLOBAL_STATE, None, ("_process_group_state()", process_group_state()), "default process group")


def add_global_state_guards(guards):
    for detail, expr, value in global_state_snapshot():
        guards.add(GLOBAL_STATE, None, (expr, value), detail)


# --- code generation ----------------------------------------------------------

class _Emitter:
    """Turns guards into (condition, message) pairs over shared local names."""

    def __init__(self, guards):
        self.ns = {
            "G": None, "B": builtins.__dict__, "torch": torch,
            "_is_grad_enabled": torch.is_grad_enabled,
            "_get_default_dtype": torch.get_default_dtype,
            "_autocast_enabled": torch.is_autocast_enabled,
            "_inference_mode": torch.is_inference_mode_enabled,
            "_process_group_state": process_group_state,
        }
        self._consts = {}
        self.uses = {}
        for g in guards:
            s = g.source
            while s is not None:
                self.uses[s] = self.uses.get(s, 0) + 1
                s = s.base_source
        self.names = {}
        self.assignments = []

    def const(self, value):
        key = id(value)
        if key not in self._consts:
            name = f"_c{len(self._consts)}"
            self._consts[key] = name
            self.ns[name] = value
        return self._consts[key]

    def render(self, source):
        if source in self.names:
            return self.names[source]
        if isinstance(source, ObjectSource):
            self.ns[source.expr()] = source.obj
        text = source.expr_over(self.render)
        if self.uses.get(source, 0) > 1 and source.base_source is not None:
            name = f"_v{len(self.names)}"
            self.names[source] = name
            self.assignments.append(f"{name} = {text}")
            return name
        return text

    def render_plain(self, source):
        if isinstance(source, ObjectSource):
            self.ns[source.expr()] = source.obj
        return source.expr_over(self.render_plain)

    def checks(self, g):
        """[(condition code, failure message f-string code)] for one guard."""
        if g.kind == SHAPE_ENV:
            return [(cond, f"f'symbolic shape guard failed: {desc}'") for cond, desc in g.expected.guards(self.render)]
        if g.kind == GLOBAL_STATE:
            expr, value = g.expected
            c = self.const(value)
            return [(f"{expr} == {c}", f"f'{g.detail} changed: {value!r} -> {{{expr}!r}}'")]
        e = self.render(g.source)
        who = g.source.name()
        if g.kind == ID_MATCH:
            c = self.const(g.expected)
            return [(f"{e} is {c}", f"f'{who} is a different object than when compiled ({_short(g.expected)})'")]
        if g.kind == TYPE_MATCH:
            c = self.const(g.expected)
            return [(f"type({e}) is {c}",
                     f"f'type of {who} changed: expected {g.expected.__qualname__}, got {{type({e}).__qualname__}}'")]
        if g.kind == CONSTANT_MATCH:
            v = g.expected
            if v is None or isinstance(v, bool):
                cond = f"{e} is {v!r}"
            else:
                cond = f"type({e}) is {self.const(type(v))} and {e} == {self.const(v)}"
            return [(cond, f"f'{who} changed: {v!r} -> {{{e}!r}}'")]
        if g.kind == ALIAS:
            other = self.render(g.expected)
            return [(f"{e} is {other}",
                     f"f'{who} and {g.expected.name()} were the same object when compiled, now they differ'")]
        if g.kind == STATE_MATCH:
            return [(f"{e}.__dict__ == {self.const(g.expected)}",
                     f"f'state of {who} changed since it was deep-copied while compiling'")]
        if g.kind == NOT_ALIAS:
            other = self.render(g.expected)
            return [(f"{e} is not {other}",
                     f"f'{who} and {g.expected.name()} were different objects when compiled, now they are the same'")]
        if g.kind == STORAGE_SHARED:
            other_source, shared = g.expected
            other = self.render(other_source)
            same = f"{e}.untyped_storage().data_ptr() == {other}.untyped_storage().data_ptr()"
            relation = "shared" if shared else "did not share"
            return [(f"({same}) is {shared}",
                     f"f'{who} and {other_source.name()} {relation} storage when compiled (the graph mutates "
                     f"inputs), now they differ'")]
        if g.kind == NO_HOOKS:
            return [(f"not ({e}._forward_hooks or {e}._forward_pre_hooks)",
                     f"f'{who} has forward hooks now; they were not traced'")]
        if g.kind == MISSING_ATTR:
            return [(f"not hasattr({e}, {g.expected!r})", f"f'{who}.{g.expected} exists now'")]
        if g.kind == LENGTH_MATCH:
            return [(f"len({e}) == {g.expected}", f"f'length of {who} changed: {g.expected} -> {{len({e})}}'")]
        if g.kind == DICT_KEYS:
            c = self.const(list(g.expected))
            return [(f"list({e}) == {c}", f"f'keys of {who} changed: {list(g.expected)!r} -> {{list({e})!r}}'")]
        if g.kind == TENSOR_MATCH:
            return self._tensor_checks(e, who, g.expected)
        raise AssertionError(g.kind)

    def _tensor_checks(self, e, who, t):
        out = [(f"type({e}) is {self.const(t.cls)}",
                f"f'{who} is no longer a {t.cls.__name__}: got {{type({e}).__qualname__}}'"),
               (f"{e}.dtype is {self.const(t.dtype)}",
                f"f'dtype of {who} changed: expected {t.dtype}, got {{{e}.dtype}}'"),
               (f"{e}.device == {self.const(t.device)}",
                f"f'device of {who} changed: expected {t.device}, got {{{e}.device}}'"),
               (f"{e}.requires_grad is {t.requires_grad}",
                f"f'requires_grad of {who} changed: expected {t.requires_grad}, got {{{e}.requires_grad}}'"),
               (f"{e}.dim() == {t.dim()}",
                f"f'rank of {who} changed: expected {t.dim()} dims, got {{{e}.dim()}}'")]
        return out, t.shape, t.stride


def _triple(message):
    # Triple double quotes, so expressions inside the f-string may use single quotes.
    if message.startswith("f'") and message.endswith("'"):
        return 'f"""' + message[2:-1] + '"""'
    return message


def compile_guards(guards, params, fn_globals, name="guard", hit=True):
    """Generate (check, explain, source_text) for a GuardSet over ``params``.

    ``check`` returns ``hit`` (what the cache entry runs) when every guard holds, else None,
    so a dispatch loop gets the function to call from the one call that checks.
    """
    em = _Emitter(guards)
    em.ns["G"] = fn_globals
    em.ns["__hit"] = hit
    check_lines = []
    explain_lines = []
    # Global state first (cheap), shape relations last (they read sizes of guarded tensors).
    ordered = sorted(guards, key=lambda g: (g.kind != GLOBAL_STATE) + 2 * (g.kind == SHAPE_ENV))
    for g in ordered:
        before = len(em.assignments)
        result = em.checks(g)
        new_assign = em.assignments[before:]
        for a in new_assign:
            check_lines.append(a)
            explain_lines.append(a)
        if g.kind == TENSOR_MATCH:
            pieces, shape, stride = result
            e = em.render(g.source)
            who = g.source.name()
            conds = [c for c, _ in pieces]
            dynamic = g.dynamic_dims
            if not dynamic:
                conds.append(f"{e}.shape == {shape!r}")
                conds.append(f"{e}.stride() == {stride!r}")
            else:
                conds += [f"{e}.size({i}) == {n}" for i, n in enumerate(shape) if i not in dynamic]
                conds.append(f"{e}.is_contiguous()" if g.expected.contiguous else f"{e}.stride() == {stride!r}")
            check_lines.append(f"if not ({' and '.join(conds)}): return None")
            for c, m in pieces:
                explain_lines.append(f"if not ({c}): return {_triple(m)}")
            for i, n in enumerate(shape):
                if i in dynamic:
                    continue
                explain_lines.append(f"if {e}.size({i}) != {n}: return " + _triple(
                    f"f'size of {who} (dim {i}): expected {n}, got {{{e}.size({i})}}'"))
            if dynamic and g.expected.contiguous:
                explain_lines.append(f"if not {e}.is_contiguous(): return " + _triple(
                    f"f'{who} is no longer contiguous'"))
            else:
                explain_lines.append(f"if {e}.stride() != {stride!r}: return " + _triple(
                    f"f'stride of {who} changed: expected {stride!r}, got {{{e}.stride()}}'"))
        else:
            conds = [c for c, _ in result]
            if not conds:
                continue
            check_lines.append(f"if not ({' and '.join(conds)}): return None")
            for c, m in result:
                explain_lines.append(f"if not ({c}): return {_triple(m)}")
    sig = ", ".join(params)
    src = [f"def {name}({sig}):", "    try:"]
    src += [f"        {line}" for line in check_lines]
    src += ["    except Exception:", "        return None", "    return __hit", ""]
    src += [f"def explain_{name}({sig}):", "    try:"]
    src += [f"        {line}" for line in explain_lines]
    src += ["    except Exception as e:",
            "        return f'guard raised {type(e).__name__}: {e}'",
            "    return None", ""]
    observed = [g for g in ordered if g.kind == TENSOR_MATCH or (
        g.kind == CONSTANT_MATCH and type(g.expected) is int)]
    src += [f"def observe_{name}({sig}):", "    out = []"]
    for g in observed:
        e = g.source.expr_over(em.render_plain)
        value = f"tuple({e}.shape)" if g.kind == TENSOR_MATCH else e
        src += ["    try:", f"        out.append({value})", "    except Exception:", "        out.append(None)"]
    src += ["    return out", ""]
    text = "\n".join(src)
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    exec(compile(text, filename, "exec"), em.ns)
    check = em.ns[name]
    # What automatic dynamic shapes compares on a miss: current sizes and ints at these sources.
    check.observe = em.ns[f"observe_{name}"]
    check.observed = observed
    return check, em.ns[f"explain_{name}"], text


def global_names(guards):
    return [g.source.global_name for g in guards if isinstance(g.source, GlobalSource)]
