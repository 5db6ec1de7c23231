"""State shared by every frame of one trace: the graph, the guards, the memo."""

import torch

from ...config import config
from ...stacks import frame_summary
from ...errors import Unsupported
from ...graph.builder import GraphBuilder
from ...guards.builder import GuardSet, add_global_state_guards
from ...guards import stamps
from ...guards.sources import AttrSource, ItemSource, LocalSource, RawAttrSource
from ...residual import set_autocast_state

# The value of a global the trace deleted (``del`` / ``global x; del x``).
DELETED = object()

# Instructions one trace may execute before giving up (unrolled loops count).
INSTRUCTION_BUDGET = 200_000
MAX_INLINE_DEPTH = 48


class Stores(dict):
    """Pending stores keyed by what they change; ``made`` counts every store put in, so code
    that stores again to an attribute, global or cell stored earlier in the trace still shows
    as having changed something (``effect_count``)."""

    def __init__(self):
        super().__init__()
        self.made = 0

    def __setitem__(self, key, value):
        self.made += 1
        super().__setitem__(key, value)

    def pop(self, *args):
        self.made += 1
        return super().pop(*args)


class TraceContext:
    def __init__(self, options, fn_globals, auto_dynamic=None, auto_dynamic_scalars=None):
        self.options = options
        self.auto_dynamic = auto_dynamic or {}                  # source -> dims seen changing
        self.auto_dynamic_scalars = auto_dynamic_scalars or set()  # int sources seen changing
        self.graph = GraphBuilder()
        self.guards = GuardSet()
        add_global_state_guards(self.guards)
        self.memo = {}                 # id(real object) -> (object, value)
        self.root_globals = fn_globals
        self.instructions_left = INSTRUCTION_BUDGET
        self.frames = []               # active frames, innermost last
        self.state_changes = []        # global state entered by with-blocks, undone at the end
        self.handled_exception = None  # the exception an except block is handling (sys.exc_info)
        self.outer_handled = []        # handled exceptions of the callers of running generators
        # Side effects on state that exists before the call: the trace works on symbolic
        # copies, the transformed function does them for real after the graph (codegen).
        self.attr_stores = Stores()    # (id(obj), name) -> (ObjectValue, name, value): replayed after the graph
        self.mutated = {}              # id(value) -> List/Dict/ConstantValue(set) read from a source and changed
        self.existing_containers = {}  # id(value) -> value: containers wrapped from real objects
        self.global_stores = Stores()  # (id(globals dict), name) -> (target source, value or DELETED)
        self.cell_stores = Stores()    # id(real cell) -> (RealCell, value)
        self.item_stores = {}          # (id(mapping), key) -> (ObjectValue, key, value or DELETED): os.environ
        self.effects_recorded = 0      # changes to state outside the trace so far (all kinds above but attrs)
        self.entry_grad_mode = torch.is_grad_enabled()
        # Memory of arrays of which a negative-stride view was taken, and of those views (traced as
        # copies): writing to either is refused (trace/numpy_api/numpy_calls.py).
        self.reversed_bases = set()
        self.reversed_copies = set()
        # trace.nn.blocks: forwards traced once and copied for other modules of their class.
        self.reuse_blocks = True
        self.block_templates = {}      # (module class, names in its tables) -> [Template]
        self.blocks_replayed = 0
        self.unguarded_reads = 0       # reads of per-instance state taken without a guard
        # runtime.persist: code objects run by the trace (-> their module's name), and facts
        # true in this process only (set order of strings, lru_cache results, hash()).
        self.inlined_codes = {}
        self.process_local = 0
        self.static_tensors = set()    # ids of optimizers' parameters and state: read like module state
        self.param_groups = set()      # ids of optimizer param_groups dicts (their "capturable" reads True)
        self.state_overrides = {}      # id(parameter or buffer) -> (it, value read instead): functional_call

    def note_optimizer(self, optimizer):
        """An optimizer is read: its state tensors are long-lived, read through get_attr by identity;
        its param groups are traced as capturable (values/builder.py says why)."""
        for per_param in optimizer.state.values():
            if isinstance(per_param, dict):
                self.static_tensors.update(id(t) for t in per_param.values() if type(t) is torch.Tensor)
        for group in optimizer.param_groups:
            self.param_groups.add(id(group))
            self.static_tensors.update(id(p) for p in group.get("params", ()) if isinstance(p, torch.Tensor))

    def undo_state_changes(self, start=0):
        """Restore the process's grad mode and autocast state as they were before the changes
        recorded from ``start`` on (all: after a trace, whatever happened inside it)."""
        for kind, saved in reversed(self.state_changes[start:]):
            if kind == "grad":
                torch._C._set_grad_enabled(saved)
            elif kind in ("autocast", "inference_mode"):
                saved.__exit__(None, None, None)
            elif kind == "autocast_state":
                device_type, state = saved
                set_autocast_state(device_type, *state)
        del self.state_changes[start:]

    def effect_count(self):
        """How many side effects the trace has recorded so far (to tell whether code made any)."""
        return self.attr_stores.made + self.global_stores.made + self.cell_stores.made + self.effects_recorded

    def is_trusted_source(self, source):
        return False

    # --- side effects ---------------------------------------------------------

    def mark_mutated(self, value, what="changing"):
        """``value`` is changed in place by the trace; a real container is updated after the graph."""
        if value.source is not None:
            _refuse_object_tables(value.source, self.guards.objects, what)
            self.mutated.setdefault(id(value), value)
            self.effects_recorded += 1
        elif id(value) in self.existing_containers:
            raise Unsupported(f"{what} a {value.python_type().__name__} that exists outside the compiled "
                              "function but cannot be re-read on later calls (no source)")
        return value

    def record_item_store(self, mapping, key, value):
        """``mapping[key] = value`` (``DELETED``: ``del``) on a real mapping read through a source
        whose own ``__setitem__`` is replayed after the graph (``os.environ``)."""
        _refuse_object_tables(mapping.source, self.guards.objects, "changing")
        self.item_stores.pop((id(mapping.obj), key), None)   # keep program order
        self.item_stores[(id(mapping.obj), key)] = (mapping, key, value)
        self.effects_recorded += 1

    def has_side_effects(self):
        return bool(self.attr_stores or self.mutated or self.global_stores or self.cell_stores
                    or self.item_stores)

    # --- dynamic shapes ---------------------------------------------------------

    def _dynamic_mode(self):
        mode = getattr(self.options, "dynamic", None)
        if not config.dynamic_shapes:
            return False
        return mode

    def dynamic_dims_for(self, tensor, source):
        """dim -> (min, max) for the dims of an input tensor (or np.ndarray) that should be symbolic."""
        mode = self._dynamic_mode()
        if mode is False:
            return {}
        dims = dict(getattr(tensor, "_bytegraph_dynamic", {}) or {})
        if mode is True:
            for d in range(tensor.ndim):
                dims.setdefault(d, (None, None))
        else:
            for d in self.auto_dynamic.get(source, ()):
                dims.setdefault(d, (None, None))
        static = getattr(tensor, "_bytegraph_static", None)
        if static == "all":
            return {}
        for d in static or ():
            dims.pop(d, None)
        return {d: b for d, b in dims.items() if d < tensor.ndim}

    def is_dynamic_float(self, source):
        """A float seen changing between calls at ``source`` is a graph input (automatic dynamic)."""
        return self._dynamic_mode() is not False and source in self.auto_dynamic_scalars \
            and not getattr(self.options, "cuda_graphs", False)

    def is_dynamic_scalar(self, source):
        mode = self._dynamic_mode()
        if mode is False:
            return False
        if mode is True:
            return isinstance(source, LocalSource)
        return source in self.auto_dynamic_scalars

    def stack_snapshot(self):
        """(code, running instruction) of the active frames, outermost first; cheap to keep."""
        return [(f.code, f.current) for f in self.frames]

    def user_stack(self, snapshot=None):
        """FrameSummary list for the active frames (or a snapshot of them), outermost first."""
        return [frame_summary(code, ins) for code, ins in (snapshot or self.stack_snapshot())]


def _refuse_object_tables(source, objects, what):
    """Changing an existing object's ``__dict__``, or one of ``nn.Module``'s tables (``_buffers``,
    ``_forward_hooks``...) of a module that exists outside the compiled function, is not traced:
    replayed after the graph, it would leave the trace reading the object as it was (a buffer
    registered in forward, then read)."""
    if isinstance(source, (AttrSource, RawAttrSource)) and source.attr == "__dict__":
        # Attribute reads go to the object's real __dict__ while tracing: keep them true.
        raise Unsupported(f"{what} the __dict__ of an object that exists outside the compiled function",
                          hint="set the attribute with obj.name = value instead")
    if isinstance(source, AttrSource):
        owner, table = source.base, source.attr               # module._buffers
    elif isinstance(source, ItemSource) and isinstance(source.base, AttrSource) \
            and source.base.attr == "__dict__":
        owner, table = source.base.base, source.index         # module.__dict__['_buffers']
    else:
        return
    if table in stamps.TABLES and isinstance(objects.get(owner), torch.nn.Module):
        raise Unsupported(f"{what} {table} of a module that exists outside the compiled function "
                          "(registering a parameter, buffer, submodule or hook) changes the module's "
                          "structure", hint="register it in __init__, or before calling the compiled function")
