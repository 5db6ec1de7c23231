"""The one settings object, ``bytegraph.config``.

Every environment variable bytegraph reads is read here, once, at import.
Setting an unknown key or a value of the wrong type raises ConfigError.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Callable, Iterator

from .errors import ConfigError

LOG_TOPICS = ("graph", "guards", "bytecode", "output_code", "recompiles", "graph_breaks", "trace", "cudagraphs",
              "minifier", "cache", "distributed", "regions")


def _env_topics():
    raw = os.environ.get("BYTEGRAPH_LOGS", "")
    topics = [t.strip() for t in raw.split(",") if t.strip()]
    if "all" in topics:
        return list(LOG_TOPICS)
    return topics


def _env_names(var):
    return [n.strip() for n in os.environ.get(var, "").split(",") if n.strip()]


REPRO_AFTER = ("frontend", "aot")
REPRO_LEVELS = (1, 2, 3, 4)


def _env_repro_after():
    raw = os.environ.get("BYTEGRAPH_REPRO_AFTER", "").strip()
    if not raw:
        return None
    if raw not in REPRO_AFTER:
        raise ConfigError(f"BYTEGRAPH_REPRO_AFTER={raw!r} is not a place to minify after; "
                          f"use one of {', '.join(REPRO_AFTER)} (or leave it unset)")
    return raw


def _env_repro_level():
    raw = os.environ.get("BYTEGRAPH_REPRO_LEVEL", "").strip()
    if not raw:
        return 2
    if raw not in {str(n) for n in REPRO_LEVELS}:
        raise ConfigError(f"BYTEGRAPH_REPRO_LEVEL={raw!r} must be 1, 2, 3 or 4 (1: write repro.py on a backend "
                          "compile error; 2: also minimise it; 3: also run-time errors; 4: also accuracy)")
    return int(raw)


def _env_flag(var):
    raw = os.environ.get(var, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{var}={raw!r} must be 1 or 0")


def _env_flag_off(var):
    """True when ``var`` is set to 0 (a setting that is on unless turned off)."""
    return os.environ.get(var, "").strip() != "" and not _env_flag(var)


def writable_dir_problem(path):
    """Why directory ``path`` cannot be used for writing (None: it can, or can be made)."""
    path = os.path.abspath(path)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory" if probe != path else "it exists and is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


# name -> (default, accepted types, help)
_SETTINGS = {
    "cache_size_limit": (8, (int,), "recompiles allowed per code object before it runs eagerly"),
    "accumulated_cache_size_limit": (256, (int,), "cache entries allowed over all code objects"),
    "log_topics": (_env_topics(), (list, tuple), "logging topics switched on (BYTEGRAPH_LOGS)"),
    "verbose": (False, (bool,), "include bytegraph's own stack in fallback warnings"),
    "suppress_errors": (True, (bool,), "an internal error while compiling runs the frame eagerly"),
    "dynamic_shapes": (os.environ.get("BYTEGRAPH_DYNAMIC_SHAPES", "1") != "0", (bool,),
                       "allow symbolic sizes at all (BYTEGRAPH_DYNAMIC_SHAPES=0 turns them off)"),
    "automatic_dynamic_shapes": (True, (bool,),
                                 "with dynamic=None, a size or int seen changing between calls becomes symbolic "
                                 "(False: every new size compiles again)"),
    "assume_static_by_default": (True, (bool,),
                                 "with dynamic=None, sizes are static until seen changing (False: symbolic from "
                                 "the first compile, as dynamic=True)"),
    "capture_scalar_outputs": (_env_flag("BYTEGRAPH_CAPTURE_SCALAR_OUTPUTS"), (bool,),
                               "trace Tensor.item() as a symbolic number read inside the graph (an unbacked "
                               "SymInt/SymFloat) instead of breaking the graph (BYTEGRAPH_CAPTURE_SCALAR_OUTPUTS=1)"),
    "capture_dynamic_output_shape_ops": (_env_flag("BYTEGRAPH_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS"), (bool,),
                                         "trace ops whose output size depends on data (nonzero, x[mask], unique, "
                                         "masked_select...) with unbacked symbolic sizes instead of breaking the "
                                         "graph (BYTEGRAPH_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS=1)"),
    "error_on_recompile": (False, (bool,),
                           "a recompile raises bytegraph.RecompileError instead of compiling again"),
    "trace_numpy": (os.environ.get("BYTEGRAPH_TRACE_NUMPY", "1") != "0", (bool,),
                    "trace NumPy code as tensor code (BYTEGRAPH_TRACE_NUMPY=0 runs NumPy natively at graph breaks)"),
    "reuse_traced_blocks": (os.environ.get("BYTEGRAPH_REUSE_BLOCKS", "1") != "0", (bool,),
                            "trace a module's forward once and copy that trace for other modules of its class "
                            "called alike, and make a frame's cache entry again for another module of the "
                            "structure it was traced for (runtime/reuse.py) (BYTEGRAPH_REUSE_BLOCKS=0 turns both "
                            "off; the graphs are the same)"),
    "nest_repeated_blocks": (_env_flag("BYTEGRAPH_NEST_REPEATED_BLOCKS"), (bool,),
                             "call each module of a ModuleList/Sequential that holds other modules of its class "
                             "built alike as a compile region (torch.compiler.nested_compile_region of its forward): "
                             "one invoke_subgraph node per call, traced once (BYTEGRAPH_NEST_REPEATED_BLOCKS=1; "
                             "default off: graphs stay flat)"),
    "regional_compile": (os.environ.get("BYTEGRAPH_REGIONAL_COMPILE", "1") != "0", (bool,),
                         "inductor compiles a graph with repeated blocks block by block, each distinct block once "
                         "(BYTEGRAPH_REGIONAL_COMPILE=0: the whole graph at once)"),
    "background_whole_compile": (os.environ.get("BYTEGRAPH_BACKGROUND_WHOLE_COMPILE", "1") != "0", (bool,),
                                 "on a GPU, a training graph inductor compiles with shared blocks is also compiled "
                                 "whole by a child process from its second call on, and calls switch to that "
                                 "once it is ready: the shared blocks' first call, the whole graph's steps "
                                 "(backends/tiers.py; BYTEGRAPH_BACKGROUND_WHOLE_COMPILE=0: training graphs are "
                                 "compiled whole at once)"),
    "lane_max_chunks": (int(os.environ.get("BYTEGRAPH_LANE_MAX_CHUNKS", "16")), (int,),
                        "at most this many chunks of an optimizer's foreach update compiled by lanes "
                        "(backends/lanes.py; each chunk is one more compiled call and its kernels a step, "
                        "fewer chunks compile more lanes each: BYTEGRAPH_LANE_MAX_CHUNKS)"),
    "persistent_cache": (os.environ.get("BYTEGRAPH_PERSISTENT_CACHE", "1") != "0", (bool,),
                         "save compiled frames on disk and load them in later processes "
                         "(BYTEGRAPH_PERSISTENT_CACHE=0 turns it off)"),
    "cache_dir": (os.environ.get("BYTEGRAPH_CACHE_DIR")
                  or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                  "bytegraph"),
                  (str,), "where the persistent cache lives (BYTEGRAPH_CACHE_DIR)"),
    "patch_torch_compile": (os.environ.get("BYTEGRAPH_PATCH_TORCH_COMPILE", "0") not in ("", "0"), (bool,),
                            "torch.compile and nn.Module.compile use bytegraph from `import bytegraph` on "
                            "(BYTEGRAPH_PATCH_TORCH_COMPILE=1); bytegraph.patch_torch_compile() does it at any time"),
    "debug_function": (_env_names("BYTEGRAPH_DEBUG_FUNCTION"), (list, tuple),
                       "compile only frames of functions with these names (BYTEGRAPH_DEBUG_FUNCTION=a,b); "
                       "empty: every frame"),
    "debug_dir": (os.environ.get("BYTEGRAPH_DEBUG_DIR", ""), (str,),
                  "write what each compile did under this directory, one folder per run "
                  "(BYTEGRAPH_DEBUG_DIR); empty: off"),
    "repro_after": (_env_repro_after(), (type(None), str),
                    "minify failing graphs handed to the backend ('frontend') or to AOTAutograd's inner "
                    "compiler ('aot') (BYTEGRAPH_REPRO_AFTER); None: off"),
    "repro_level": (_env_repro_level(), (int,),
                    "1: write repro.py on a backend compile error; 2: and minimise it; 3: also run-time "
                    "errors of the compiled graph; 4: also results that differ from eager "
                    "(BYTEGRAPH_REPRO_LEVEL)"),
    "repro_dir": (os.environ.get("BYTEGRAPH_REPRO_DIR", ""), (str,),
                  "where repro.py files go (BYTEGRAPH_REPRO_DIR); empty: <debug_dir run>/repro, else "
                  "./bytegraph_repro"),
    "replay_record_enabled": (_env_flag("BYTEGRAPH_REPLAY_RECORD"), (bool,),
                              "an internal error while tracing writes a record that bytegraph.replay(path) "
                              "retraces (BYTEGRAPH_REPLAY_RECORD=1)"),
    "optimize_ddp": (not _env_flag_off("BYTEGRAPH_OPTIMIZE_DDP"), (bool,),
                     "split graphs compiled inside a DistributedDataParallel forward at its gradient-bucket "
                     "boundaries, so each bucket's all-reduce overlaps the rest of backward "
                     "(BYTEGRAPH_OPTIMIZE_DDP=0: one graph)"),
    "replay_record_dir": (os.environ.get("BYTEGRAPH_REPLAY_RECORD_DIR", ""), (str,),
                          "where replay records go (BYTEGRAPH_REPLAY_RECORD_DIR); empty: <debug_dir run>/replay, "
                          "else ./bytegraph_replay"),
}

# settings holding a directory to write to: checked on assignment, and again when first written
DIRECTORY_SETTINGS = {"debug_dir": "BYTEGRAPH_DEBUG_DIR", "repro_dir": "BYTEGRAPH_REPRO_DIR",
                      "replay_record_dir": "BYTEGRAPH_REPLAY_RECORD_DIR"}

# setting name -> functions called with each new value; higher floors react to settings
# without config importing them (debug.logs watches log_topics).
_watchers = {}


def watch(name: str, on_change: Callable[[Any], None]) -> None:
    """Call ``on_change(value)`` whenever setting ``name`` is assigned."""
    _watchers.setdefault(name, []).append(on_change)


class Config:
    """Settings for bytegraph. Assign attributes; unknown names are errors."""

    __slots__ = tuple(_SETTINGS)

    def __init__(self):
        for name, (default, _, _) in _SETTINGS.items():
            object.__setattr__(self, name, default)
        for name, var in DIRECTORY_SETTINGS.items():
            value = getattr(self, name)
            problem = value and writable_dir_problem(value)
            if problem:
                raise ConfigError(f"{var}={value!r} cannot be written to: {problem}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _SETTINGS:
            known = ", ".join(sorted(_SETTINGS))
            raise ConfigError(f"bytegraph.config has no setting {name!r}; known settings: {known}")
        default, types, _ = _SETTINGS[name]
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(
                f"bytegraph.config.{name} must be {names}, got {type(value).__name__} {value!r}")
        if name.endswith("_limit") and value < 1:
            raise ConfigError(f"bytegraph.config.{name} must be at least 1, got {value}")
        if name == "log_topics":
            unknown = [t for t in value if t not in LOG_TOPICS]
            if unknown:
                raise ConfigError(f"unknown log topics {unknown}; known: {', '.join(LOG_TOPICS)}")
            value = list(value)
        if name == "debug_function":
            bad = [n for n in value if not isinstance(n, str) or not n]
            if bad:
                raise ConfigError(f"bytegraph.config.debug_function takes function names (str), got {bad!r}")
            value = list(value)
        if name == "repro_after" and value is not None and value not in REPRO_AFTER:
            raise ConfigError(f"bytegraph.config.repro_after must be None or one of "
                              f"{', '.join(map(repr, REPRO_AFTER))}, got {value!r}")
        if name == "repro_level" and value not in REPRO_LEVELS:
            raise ConfigError(f"bytegraph.config.repro_level must be 1, 2, 3 or 4, got {value!r}")
        if name in DIRECTORY_SETTINGS and value:
            problem = writable_dir_problem(value)
            if problem:
                raise ConfigError(f"bytegraph.config.{name} = {value!r} cannot be written to: {problem}")
        object.__setattr__(self, name, value)
        for on_change in _watchers.get(name, ()):
            on_change(value)

    def __getattr__(self, name: str) -> Any:
        known = ", ".join(sorted(_SETTINGS))
        raise ConfigError(f"bytegraph.config has no setting {name!r}; known settings: {known}")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SETTINGS}

    @contextlib.contextmanager
    def patch(self, **changes: Any) -> Iterator[Config]:
        """Temporarily change settings: ``with config.patch(cache_size_limit=2): ...``"""
        old = {name: getattr(self, name) for name in changes}
        for name, value in changes.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in old.items():
                setattr(self, name, value)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"bytegraph.config({body})"


config = Config()

_warned = set()


def warn_once(key, message):
    """``message`` as a RuntimeWarning the first time ``key`` comes up in this process: for
    settings and markers of torch.compile that bytegraph has no equivalent for (never silent)."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
