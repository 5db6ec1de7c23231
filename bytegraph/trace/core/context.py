"""State shared by every frame of one trace: the graph, the guards, the memo, the side effects."""

import types
import typing

import torch

from ...config import config
from ...control import marked_dims
from ...stacks import frame_summary
from ...graph.builder import GraphBuilder
from ...guards.builder import GuardSet, add_global_state_guards
from ...guards.sources import LocalSource
from ...residual import set_autocast_state
from .side_effects import DELETED, SideEffects, Stores  # noqa: F401 (DELETED, Stores: reached as context.<name>)

# Instructions one trace may execute before giving up (unrolled loops count).
INSTRUCTION_BUDGET = 200_000
MAX_INLINE_DEPTH = 48


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
        # root-frame row index of a call -> the break an earlier trace met inside that callee
        # (runtime.compile_frame's known breaking calls; only for the callee's code)
        self.known_breaks = None
        self.state_changes = []        # global state entered by with-blocks, undone at the end
        self.handled_exception = None  # the exception an except block is handling (sys.exc_info)
        self.outer_handled = []        # handled exceptions of the callers of running generators
        # Side effects on state that exists before the call: the trace works on symbolic
        # copies, the transformed function does them for real after the graph (codegen).
        self.effects = SideEffects(self.guards.objects)
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
            elif kind in ("autocast", "inference_mode", "index_by_tensors"):
                saved.__exit__(None, None, None)
            elif kind == "autocast_state":
                device_type, state = saved
                set_autocast_state(device_type, *state)
        del self.state_changes[start:]

    def is_trusted_source(self, source):
        return False

    # --- dynamic shapes ---------------------------------------------------------

    def _dynamic_mode(self):
        mode = getattr(self.options, "dynamic", None)
        if not config.dynamic_shapes:
            return False
        if mode is None and not config.assume_static_by_default:
            return True     # every size symbolic from the first compile (torch's dynamic=True is this)
        return mode

    def dynamic_dims_for(self, tensor, source):
        """dim -> (min, max) for the dims of an input tensor (or np.ndarray) that should be symbolic."""
        mode = self._dynamic_mode()
        if not config.dynamic_shapes:
            return {}
        # bytegraph's and torch's mark_dynamic / mark_static (control.marked_dims): an explicit
        # dynamic mark wins over mark_static and over dynamic=False, as under torch.compile.
        marked, static = marked_dims(tensor)
        dims = {}
        if mode is True:
            dims = dict.fromkeys(range(tensor.ndim), (None, None))
        elif mode is None:
            dims = dict.fromkeys(self.auto_dynamic.get(source, ()), (None, None))
        for d in static:
            dims.pop(d, None)
        dims.update(marked)
        return {d: b for d, b in dims.items() if d < tensor.ndim}

    def is_dynamic_float(self, source):
        """A float seen changing between calls at ``source`` is a graph input (automatic dynamic)."""
        return self._dynamic_mode() is not False and source in self.auto_dynamic_scalars \
            and not getattr(self.options, "cuda_graphs", False)

    def is_dynamic_numpy_scalar(self, source):
        """A NumPy scalar seen changing between calls at ``source`` is a 0-d array input of the
        graph (automatic dynamic, as for floats)."""
        return self._dynamic_mode() is not False and source in self.auto_dynamic_scalars

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


class RunningFrame(typing.Protocol):
    """The running frame as the rooms below the machine see it in their signatures: they pass it
    on and read its trace context, code and globals (the class is ``machine.frame.Frame``, a room
    above them)."""
    tx: TraceContext
    code: types.CodeType
    globals: dict
