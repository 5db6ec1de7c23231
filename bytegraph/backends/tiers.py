"""Two tiers on a GPU: the quick compile's first call, the whole graph's steps.

On a GPU, Inductor compiles a training graph with repeated blocks several times faster with each
distinct block compiled once (shared blocks, ``backends/subgraphs.py``), but its steps then cost
more than the graph compiled whole (an input check and output allocation per block call, no
fusion across block edges): GPT-2 small's training step on an H200, three processes each
alternating the compilers, ran 1.066x torch.compile's shared against 1.003x compiled whole.

A ``Tiered`` callable keeps both. The quick compile is the shared blocks, or the graph split at
its blocks where they fail, or an optimizer's update in lanes (``backends/inductor.py``), with
cheaper Inductor settings. It calls
the quick compile's result, and from its second call
on a child process compiles the same graph whole, which fills Inductor's (and, for a graph it
caches, AOTAutograd's) on-disk caches; once the child has ended, the next call compiles the graph whole in this process,
from those caches (about 5 s for GPT-2 small on an H200, where a cold compile took 25), and calls
use that from then on. Should the child fail, the quick compile stays (logged under ``bytegraph.regions``).

The child gets the graph written down (``GraphRecord``: each node's op, name, target and
arguments; the shape, strides, dtype and device of every parameter, buffer and input, never their
data), Inductor's and AOTAutograd's settings, grad mode, autocast, the matmul precision settings,
the thread count and the default dtype, and compiles it with fake tensors only: it allocates no
GPU memory for the model. This process compiles the same record, with its own parameters and
buffers in it, so both ask the caches for the same keys. Node targets go by name, or by value
where their class says ``carried_by_value`` (a traced custom autograd Function, a subclass
constructor: graphs they call are written down in turn). A graph that cannot be written down (a
submodule or higher-order operator, a tensor constant in an argument, a target pickle cannot
carry, inputs that share memory) is not tiered; on a GPU, a training graph is then compiled
whole at once.

Threads were tried first (branch ``tiers9``): AOTAutograd tracing in a thread while compiled code
ran in the main one crashed the process in C++ on an H200. A child process shares nothing."""
import atexit
import contextlib
import hashlib
import io
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time

import torch
import torch.fx as fx

from ..config import config
from . import regions

log = logging.getLogger("bytegraph.regions")

MAX_CHILDREN = 2          # child compiles running at once; more wait for a free one
START_AT_CALL = 2         # the first call's own compiles (its backward too) are not competed with

_children = []            # running child processes
outcomes = []             # one dict per second tier that came in or was given up, in order


# --- writing a graph down ------------------------------------------------------------------------

class NotRecordable(Exception):
    """Why a graph cannot be written down for another process."""


class _Ref:
    """An argument that is the result of node number ``index``."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _overload(namespace, name, overload):
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _packet(namespace, name):
    return getattr(getattr(torch.ops, namespace), name)


class _Pickler(pickle.Pickler):
    """Standard pickling, with torch's operators by name and anything carrying data refused."""

    def reducer_override(self, obj):
        if isinstance(obj, torch._ops.OpOverload):
            namespace, name = obj._schema.name.split("::")
            return _overload, (namespace, name, obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::")
            return _packet, (namespace, name)
        if isinstance(obj, fx.GraphModule):
            # A graph a target carried by value calls (a custom autograd Function's forward and
            # backward): written down, node for node, as the record's own graph is.
            return _graph_from_rows, (_rows(obj, nested=True),)
        if isinstance(obj, (torch.Tensor, torch.nn.Module, fx.Node, torch.SymInt, torch.SymFloat,
                            torch.SymBool, torch._ops.HigherOrderOperator)):
            raise NotRecordable(f"{type(obj).__name__} in the graph")
        return NotImplemented


def _dumps(obj):
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except NotRecordable:
        raise
    except Exception as exc:     # noqa: BLE001 - whatever pickle refuses
        raise NotRecordable(f"cannot be pickled: {type(exc).__name__}: {exc}") from exc
    return stream.getvalue()


class TensorSpec:
    """What a compile reads of a tensor: shape, strides, dtype, device, requires_grad, and
    whether it is a Parameter."""
    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad", "parameter")

    def __init__(self, t):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            raise NotRecordable(f"a {type(t).__name__} ({t.layout}) among the graph's tensors")
        if t.storage_offset() != 0 or t.is_inference():
            raise NotRecordable("a tensor starting inside its storage, or an inference tensor")
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.dtype = t.dtype
        self.device = str(t.device)
        self.requires_grad = t.requires_grad
        self.parameter = isinstance(t, torch.nn.Parameter)

    def fake(self, mode):
        """A fake tensor of this description in ``mode`` (no memory)."""
        with mode:
            t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        if self.parameter:
            return torch.nn.Parameter(t, requires_grad=self.requires_grad)
        return t.requires_grad_(self.requires_grad)


class GraphRecord:
    """A graph written down: enough to build it again in another process, node for node.

    ``nodes``: pickled (op, name, target, args, kwargs) rows, node results as ``_Ref``;
    ``state``: (target, kind, index) for each ``get_attr`` target, kind 'parameter', 'buffer' or
    'attribute', index into ``state_specs`` (one entry per distinct tensor: tied weights stay
    tied); ``inputs``: a TensorSpec or a plain value for each placeholder."""

    def __init__(self, gm, example_inputs):
        rows = _rows(gm)
        self.nodes = _dumps(rows)
        self.state, self.state_specs, tensors = [], [], []
        by_id = {}
        for node in gm.graph.nodes:
            if node.op != "get_attr" or any(s[0] == node.target for s in self.state):
                continue
            owner, leaf = _owner(gm, node.target)
            value = getattr(owner, leaf)
            if not isinstance(value, torch.Tensor):
                raise NotRecordable(f"{node.target} is a {type(value).__name__}")
            kind = ("parameter" if leaf in owner._parameters else "buffer" if leaf in owner._buffers
                    else "attribute")
            if id(value) not in by_id:
                by_id[id(value)] = len(self.state_specs)
                self.state_specs.append(TensorSpec(value))
                tensors.append(value)
            self.state.append((node.target, kind, by_id[id(value)]))
        self.inputs = []
        for value in example_inputs:
            if isinstance(value, torch.Tensor):
                self.inputs.append(TensorSpec(value))
                tensors.append(value)
            elif value is None or type(value) in (int, float, bool):
                self.inputs.append(value)
            else:
                raise NotRecordable(f"an input of type {type(value).__name__}")
        _no_shared_memory(tensors)
        self.state_tensors = tensors[:len(self.state_specs)]

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("state_tensors", None)      # this process's own tensors stay here
        return state

    def build(self, state_tensors):
        """The graph as a GraphModule holding ``state_tensors`` (one per ``state_specs`` entry)."""
        root = torch.nn.Module()
        for target, kind, i in self.state:
            owner = root
            *path, leaf = target.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            value = state_tensors[i]
            if kind == "parameter":
                owner.register_parameter(leaf, value)
            elif kind == "buffer":
                owner.register_buffer(leaf, value)
            else:
                setattr(owner, leaf, value)
        return _graph_from_rows(_loads(self.nodes), root)

    def fake_inputs(self, mode):
        return [v.fake(mode) if isinstance(v, TensorSpec) else v for v in self.inputs]


def _rows(gm, nested=False):
    """``gm``'s nodes as (op, name, target, args, kwargs) rows, node results as ``_Ref``; a
    graph a node calls (``nested``) may hold no tensors of its own (they would be data)."""
    what = "a graph called by a node" if nested else "the graph"
    if type(gm.graph._codegen) is not fx.graph.CodeGen:
        raise NotRecordable(f"{what}'s code is generated by {type(gm.graph._codegen).__name__}")
    index = {}
    rows = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "call_module":
            raise NotRecordable(f"a submodule call ({node.target})")
        if node.op == "get_attr" and nested:
            raise NotRecordable(f"{what} reads {node.target}")
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: _Ref(index[n]))
        target = node.target
        if not isinstance(target, str) and not _carried(target):
            raise NotRecordable(f"{target!r} is not importable")
        rows.append((node.op, node.name, target, args, kwargs))
    return rows


def _graph_from_rows(rows, root=None):
    graph = fx.Graph()
    made = []
    for op, name, target, args, kwargs in rows:
        args, kwargs = _resolve((args, kwargs), made)
        made.append(graph.create_node(op, target, args, kwargs, name=name))
    return fx.GraphModule(torch.nn.Module() if root is None else root, graph)


def _carried(target):
    """May pickle carry ``target`` to another process? A function or operator goes by name; an
    object whose class says ``carried_by_value`` (bytegraph's own graph targets: a traced
    autograd Function, a subclass constructor) goes by value, graphs it calls written down
    (pickling the record refuses, saying why, what it cannot carry)."""
    return getattr(type(target), "carried_by_value", False) or _importable(target)


def _importable(target):
    """Does pickle carry ``target`` by name, to itself (not a copy, nor something else)?"""
    try:
        return _loads(_dumps(target)) is target
    except Exception:     # noqa: BLE001 - refused or not found again
        return False


def _loads(data):
    return pickle.loads(data)


def _resolve(value, made):
    if isinstance(value, _Ref):
        return made[value.index]
    if isinstance(value, (tuple, list)):
        return type(value)(_resolve(v, made) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, made) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_resolve(v, made) for v in (value.start, value.stop, value.step)))
    return value


def _owner(gm, target):
    *path, leaf = target.split(".")
    owner = gm
    for part in path:
        owner = getattr(owner, part)
    return owner, leaf


def _no_shared_memory(tensors):
    """Refuse tensors sharing memory (other than one tensor named twice): fakes made from their
    descriptions would not, and AOTAutograd compiles aliased inputs differently. A view sharing
    memory with nothing else in the graph is compiled as the plain tensor it looks like (as a
    recompile would see it)."""
    seen = {}
    for t in tensors:
        if t.numel() == 0 or t.device.type == "meta":
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key in seen and seen[key] is not t:
            raise NotRecordable("two of the graph's tensors share memory")
        seen[key] = t


# --- what the compile depends on besides the graph ------------------------------------------------

def _matmul(name):
    obj, attr = {"cuda": (torch.backends.cuda.matmul, "allow_tf32"),
                 "cuda_fp16": (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
                 "cuda_bf16": (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
                 "cuda_fp32": (torch.backends.cuda.matmul, "fp32_precision"),
                 "cudnn": (torch.backends.cudnn, "allow_tf32"),
                 "cudnn_fp32": (torch.backends.cudnn, "fp32_precision")}[name]
    return obj, attr


_MATMUL = ("cuda", "cuda_fp16", "cuda_bf16", "cuda_fp32", "cudnn", "cudnn_fp32")


def _settings():
    """Process-wide settings that enter a compile (and the caches' keys)."""
    matmul = {}
    for name in _MATMUL:
        obj, attr = _matmul(name)
        if hasattr(obj, attr):
            matmul[name] = getattr(obj, attr)
    return {
        "global_state": regions._global_state(regions._AUTOCAST_DEVICES),
        "deterministic": regions.deterministic_mode(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "matmul": matmul,
        # Inductor's key reads these too: C++ kernels are made for the thread count, factory
        # calls without a dtype for the default one.
        "threads": torch.get_num_threads(),
        "default_dtype": torch.get_default_dtype(),
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
    }


def _apply_settings(settings):
    """``settings`` here, each changed only where it differs: torch's older and newer switches for
    the same thing (``allow_tf32``, ``fp32_precision``) overwrite each other when set, and the
    caches' keys read the newer one ("none" differs from "ieee")."""
    regions.set_global_state(*settings["global_state"])
    regions.set_deterministic_mode(settings["deterministic"])
    if torch.get_float32_matmul_precision() != settings["float32_matmul_precision"]:
        torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    for name in _MATMUL:
        obj, attr = _matmul(name)
        if name in settings["matmul"] and getattr(obj, attr, None) != settings["matmul"][name]:
            setattr(obj, attr, settings["matmul"][name])
    if torch.get_num_threads() != settings["threads"]:
        torch.set_num_threads(settings["threads"])
    if torch.get_default_dtype() != settings["default_dtype"]:
        torch.set_default_dtype(settings["default_dtype"])
    torch.utils.deterministic.fill_uninitialized_memory = settings["fill_uninitialized_memory"]


def caches_on():
    """Are the on-disk caches the second tier is loaded from turned on?"""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    return bool(inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
                and not inductor_config.force_disable_caches and not inductor_config.freezing)


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True, shape_env=ShapeEnv())


def possible(gm, example_inputs):
    """Could ``gm`` be compiled in two tiers? On a GPU (on the CPU kernels run in the caller's
    thread, and a child compiling would take the cores the steps run on), with the setting on,
    the caches on, static sizes (fake inputs carry the tracer's shape environment), and no torch
    function or dispatch mode active (the child would not have it)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return (config.background_whole_compile and regions.on_cuda(gm) and caches_on()
            and not any(isinstance(t, FakeTensor) for t in example_inputs)
            and torch._C._len_torch_function_stack() == 0 and not _get_current_dispatch_mode_stack()
            and not torch.is_inference_mode_enabled())


class WholeLater:
    """What the second tier needs: the graph written down, the settings it was compiled under, and
    (this process only) the ``finish`` that turns the whole compile's result into the graph's
    callable, as the quick one's is (outputs regrouped, gradients gated)."""

    def __init__(self, record, config_patches, finish, compile_whole, source=None):
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config
        self.record = record
        self.config_patches = dict(config_patches or {})
        self.settings = _settings()
        try:
            self.configs = (inductor_config.save_config(), functorch_config.save_config())
        except Exception as exc:       # noqa: BLE001 - a setting pickle refuses (a custom pass)
            raise NotRecordable(f"Inductor's settings cannot be pickled: {exc}") from exc
        self.finish = finish
        # The graph the record was written from, its nodes' fake values kept (this process only):
        # compiling the record here reads them instead of running the graph on fakes again.
        self.source = source
        if not _importable(compile_whole):
            raise NotRecordable(f"{compile_whole!r} is not importable")
        self.compile_whole = compile_whole

    def job(self):
        return _dumps({"record": self.record, "config_patches": self.config_patches, "compile": self.compile_whole,
                       "settings": self.settings, "configs": self.configs})


def compile_record(record, state_tensors, compile_whole, config_patches, settings, mode=None, source=None):
    """Compile ``record`` whole with ``compile_whole(gm, example_inputs, config_patches)`` (the
    backend's, carried to the child by name), its backward too, under ``settings``, with fake
    inputs: the same calls, and so the same cache keys, here and in a child. ``source``: the
    graph the record was written from, where this process still has it."""
    from torch._functorch import config as functorch_config
    with regions.global_state_kept(None):
        regions.set_global_state(*settings["global_state"])
        gm = record.build(state_tensors)
        mode = mode or _fake_mode()
        fakes = record.fake_inputs(mode)
        if not _example_values_from(gm, source):
            _note_example_values(gm, fakes, mode)
        # The backward too, now: compiled lazily, it would be compiled at the first backward().
        with functorch_config.patch(force_non_lazy_backward_lowering=True), _autocast_cacheable():
            return compile_whole(gm, fakes, config_patches)


# The graph's ``with torch.autocast`` block: AOTAutograd runs these while it traces (the casts are
# in what it compiles, the calls are not), their arguments are constants in the graph's code, which
# the cache key reads. AOTAutograd's cache refuses functions it does not know, these two included.
_AUTOCAST_FUNCTIONS = ("torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast")


def _autocast_cacheable():
    """AOTAutograd's cache allowed to keep a graph with a ``with torch.autocast`` block, for this
    compile only (the child's and this process's at the switch: the same setting, the same keys).
    Without, the whole training step (autocast inside) was traced through AOTAutograd again at
    every switch."""
    from torch._inductor import config as inductor_config
    if not hasattr(inductor_config, "unsafe_marked_cacheable_functions"):
        return contextlib.nullcontext()
    marked = dict(inductor_config.unsafe_marked_cacheable_functions)
    marked.update({name: torch.__version__ for name in _AUTOCAST_FUNCTIONS})
    return inductor_config.patch(unsafe_marked_cacheable_functions=marked)


def _example_values_from(gm, source):
    """Each node's ``meta["example_value"]`` copied from ``source``'s, where ``source`` is the
    graph ``gm`` was built from (the same nodes in the same order) and every node but a function
    call's that returns nothing has one; False, leaving ``gm`` as it was, otherwise.
    They are only read for their shapes and dtypes (by AOTAutograd's cache check and Inductor's
    passes, which take a value's own fake mode), not run with the compile's inputs. Running the
    graph on fakes again took 0.6 s of a later process's 5.9 s first call (CPU, 12 layers)."""
    if source is None:
        return False
    pairs = list(zip(gm.graph.nodes, source.graph.nodes))
    if len(pairs) != len(gm.graph.nodes) or len(pairs) != len(source.graph.nodes):
        return False
    values = []
    for built, original in pairs:
        if (built.op, built.name) != (original.op, original.name):
            return False
        if built.op == "output":
            continue
        value = original.meta.get("example_value", original.meta.get("val"))
        if value is None and built.op != "call_function":
            return False
        values.append((built, value))
    for built, value in values:
        if value is not None:
            built.meta["example_value"] = value
    return True


def _note_example_values(gm, fakes, mode):
    """Each node's fake value in ``meta["example_value"]``, where a traced graph has it: AOTAutograd
    caches a graph with ``call_method`` nodes only when their tensors carry one. Without, both the
    child's compile and this process's at the switch went around its cache, and this one traced
    the whole graph through AOTAutograd again (GPT-2 small compiled alone, on an H200: the
    switch took 6.4 s)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception as exc:    # noqa: BLE001 - compiled all the same, around the cache
        logging.getLogger("bytegraph.regions").info("no example values for AOTAutograd's cache: %s", exc)
        return
    for n in gm.graph.nodes:
        if "val" in n.meta:
            n.meta.setdefault("example_value", n.meta["val"])


# --- a later process: the whole compile straight from the caches --------------------------------

def _canonical(value):
    """``value`` as text that is the same in every process for the same graph and settings:
    node results by number, functions and operators by name, sets and dicts in a sorted order (a
    set's own order follows the process's string hashing). Not the pickled bytes: pickle shares
    an object met twice, and a graph traced here and the same graph loaded from bytegraph's
    cache share different objects. Raises ValueError for a value whose text names its address."""
    if isinstance(value, _Ref):
        return f"%{value.index}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{_canonical(k)}: {_canonical(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_canonical(v) for v in value) + ")"
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(value)
    if getattr(type(value), "carried_by_value", False):
        return f"{type(value).__qualname__}:{_dumps(value).hex()}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:
        raise ValueError(f"no text the same in every process for {text}")
    return text


def _devices(record):
    names = set()
    for spec in list(record.state_specs) + [v for v in record.inputs if isinstance(v, TensorSpec)]:
        device = torch.device(spec.device)
        names.add(f"{device}: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else str(device))
    return sorted(names)


def whole_key(later):
    """What names ``later``'s whole compile across processes: the graph written down, the
    settings and Inductor's and AOTAutograd's configs it is compiled under, torch's version and
    the devices. None where it cannot be worked out (then nothing is looked up or noted)."""
    try:
        configs = [pickle.loads(c) for c in later.configs]
        record = later.record
        specs = [tuple(getattr(v, a) for a in TensorSpec.__slots__) if isinstance(v, TensorSpec) else v
                 for v in list(record.state_specs) + list(record.inputs)]
        parts = (torch.__version__, _devices(record), _canonical(_loads(record.nodes)),
                 _canonical((record.state, specs)), _canonical(later.config_patches),
                 f"{later.compile_whole.__module__}.{later.compile_whole.__qualname__}",
                 _canonical(later.settings), _canonical(configs))
    except Exception as exc:    # noqa: BLE001 - a setting without a stable text: not looked up
        log.debug("no key for the whole compile: %s", exc)
        return None
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:32]


def _marker(later):
    """The file that says an earlier process's second tier compiled ``later`` whole, in Inductor's
    cache folder: cleared with the caches it speaks for."""
    key = whole_key(later)
    if key is None:
        return None
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return os.path.join(cache_dir(), "bytegraph_whole", key)


def note_whole_cached(later):
    """Note that ``later``'s whole compile is in the caches (this process loaded it from them)."""
    path = _marker(later)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{time.time()}\n")
    except OSError as exc:
        log.debug("could not note the whole compile as cached: %s", exc)


def whole_from_caches(later, label="graph"):
    """The graph's callable compiled whole now, where an earlier process's second tier left that
    compile in the caches (compiling it from them takes seconds: no quick tier, no child);
    None where no such compile is noted, or compiling it fails (the two tiers then go on)."""
    path = _marker(later)
    if path is None or not os.path.exists(path):
        return None
    started = time.perf_counter()
    try:
        whole = compile_record(later.record, later.record.state_tensors, later.compile_whole,
                               later.config_patches, later.settings, source=later.source)
    except Exception as exc:    # noqa: BLE001 - the two tiers instead
        log.warning("%s: the whole compile an earlier process left in the caches failed here (%s: %s); "
                    "compiled in two tiers instead", label, type(exc).__name__, exc)
        return None
    seconds = time.perf_counter() - started
    outcomes.append({"label": label, "whole": True, "from_caches": True, "load_s": seconds})
    log.info("%s: compiled whole from the caches an earlier process filled, in %.1f s", label, seconds)
    return later.finish(whole)


# --- the two tiers -------------------------------------------------------------------------------

class Tiered:
    """A compiled graph's callable: ``quick`` until the whole compile is in, then that."""

    def __init__(self, quick, later, label="graph"):
        self.call = quick
        self.label = label
        self.whole = None           # the whole compile's callable, once it is in
        self.error = None           # why the second tier did not come in, if it did not
        self.switch_seconds = None  # how long compiling from the filled caches took here
        self._later = later
        self._calls = 0
        self._child = None
        self._job_dir = None
        self._started = None

    def __call__(self, *args):
        if self._later is not None:
            self._advance()
        return self.call(*args)

    def _advance(self):
        if self._child is None:
            self._calls += 1
            if self._calls >= START_AT_CALL:
                self._start()
            return
        if self._child.poll() is None:
            return
        later, self._later = self._later, None
        rc = self._child.returncode
        if rc != 0:
            self._give_up(f"the child compile exited with {rc}: {_tail(self._log_path())}")
            return
        started = time.perf_counter()
        try:
            whole = compile_record(later.record, later.record.state_tensors, later.compile_whole,
                                   later.config_patches, later.settings, source=later.source)
        except Exception as exc:    # noqa: BLE001 - the quick compile stays
            self._give_up(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self._clean()
        self.switch_seconds = time.perf_counter() - started
        self.whole = self.call = later.finish(whole)
        note_whole_cached(later)
        outcomes.append({"label": self.label, "whole": True, "child_s": started - self._started,
                         "load_s": self.switch_seconds})
        log.info("%s: compiled whole by a child in %.1f s, loaded here in %.1f s; calls use it from now on",
                 self.label, started - self._started, self.switch_seconds)

    def _start(self):
        _reap()
        if len(_children) >= MAX_CHILDREN:
            return
        try:
            job = self._later.job()
        except NotRecordable as exc:
            self._later = None
            self._give_up(str(exc))
            return
        self._job_dir = tempfile.mkdtemp(prefix="bytegraph_whole_")
        path = os.path.join(self._job_dir, "job.pickle")
        with open(path, "wb") as f:
            f.write(job)
        env = dict(os.environ)
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir()
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(self._log_path(), "wb") as out:
            self._child = subprocess.Popen([sys.executable, "-m", "bytegraph.backends.tiers", path],
                                           stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env)
        self._started = time.perf_counter()
        _children.append(self._child)

    def _log_path(self):
        return os.path.join(self._job_dir, "child.log")

    def _give_up(self, why):
        self._later = None
        self.error = why
        outcomes.append({"label": self.label, "whole": False, "error": why})
        log.warning("%s: not compiled whole in the background (%s); it keeps its quick compile",
                    self.label, why)
        self._clean()

    def _clean(self):
        if self._job_dir is not None:
            import shutil
            shutil.rmtree(self._job_dir, ignore_errors=True)
            self._job_dir = None

    def wait(self, timeout=None):
        """Block until the second tier is in or given up (``timeout`` seconds at most): the child
        started if it was not, waited for, and its result loaded. True when it came in."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._later is not None:
            if self._child is None:
                self._calls = max(self._calls, START_AT_CALL - 1)
                self._advance()
                if self._child is None and self._later is not None:
                    _wait_any(deadline)       # every slot busy: wait for one
                    continue
            elif self._child.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                try:
                    self._child.wait(left)
                except subprocess.TimeoutExpired:
                    return False
            self._advance()
        return self.whole is not None


_tiered = []     # every Tiered made, weakly: for wait_for_background_compiles


def tiered(quick, later, label):
    import weakref
    t = Tiered(quick, later, label)
    _tiered.append(weakref.ref(t))
    return t


def wait_for_background_compiles(timeout=None):
    """Block until every graph compiled in two tiers so far has its whole compile in (or has
    given it up): for a benchmark that wants the steady state, or a test. ``timeout``: seconds at
    most (None: no limit). True when none is left pending."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for ref in list(_tiered):
        t = ref()
        if t is None:
            continue
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        t.wait(left)
    _tiered[:] = [r for r in _tiered if r() is not None and r()._later is not None]
    return not _tiered


def _reap():
    _children[:] = [c for c in _children if c.poll() is None]


def _wait_any(deadline):
    while True:
        _reap()
        if len(_children) < MAX_CHILDREN:
            return
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _tail(path, lines=5):
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no output)"


@atexit.register
def _stop_children():
    """Children still compiling at exit are stopped: this process no longer needs them."""
    for child in list(_children):
        if child.poll() is None:
            child.terminate()


def _child_main(path):
    with open(path, "rb") as f:
        job = pickle.load(f)
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    inductor_config.load_config(job["configs"][0])
    functorch_config.load_config(job["configs"][1])
    _apply_settings(job["settings"])
    record = job["record"]
    mode = _fake_mode()
    state = [spec.fake(mode) for spec in record.state_specs]
    compile_record(record, state, job["compile"], job["config_patches"], job["settings"], mode)


if __name__ == "__main__":
    _child_main(sys.argv[1])
