"""The one settings object, ``bytegraph.config``.

Every environment variable bytegraph reads is read here, once, at import.
Setting an unknown key or a value of the wrong type raises ConfigError.
"""
import contextlib
import os

from .errors import ConfigError

LOG_TOPICS = ("graph", "guards", "bytecode", "output_code", "recompiles", "graph_breaks", "trace", "cudagraphs")


def _env_topics():
    raw = os.environ.get("BYTEGRAPH_LOGS", "")
    topics = [t.strip() for t in raw.split(",") if t.strip()]
    if "all" in topics:
        return list(LOG_TOPICS)
    return topics


def _env_names(var):
    return [n.strip() for n in os.environ.get(var, "").split(",") if n.strip()]


# name -> (default, accepted types, help)
_SETTINGS = {
    "cache_size_limit": (8, (int,), "recompiles allowed per code object before it runs eagerly"),
    "accumulated_cache_size_limit": (256, (int,), "cache entries allowed over all code objects"),
    "log_topics": (_env_topics(), (list, tuple), "logging topics switched on (BYTEGRAPH_LOGS)"),
    "verbose": (False, (bool,), "include bytegraph's own stack in fallback warnings"),
    "suppress_errors": (True, (bool,), "an internal error while compiling runs the frame eagerly"),
    "dynamic_shapes": (os.environ.get("BYTEGRAPH_DYNAMIC_SHAPES", "1") != "0", (bool,),
                       "allow symbolic sizes at all (BYTEGRAPH_DYNAMIC_SHAPES=0 turns them off)"),
    "patch_torch_compile": (os.environ.get("BYTEGRAPH_PATCH_TORCH_COMPILE", "0") not in ("", "0"), (bool,),
                            "torch.compile and nn.Module.compile use bytegraph from `import bytegraph` on "
                            "(BYTEGRAPH_PATCH_TORCH_COMPILE=1); bytegraph.patch_torch_compile() does it at any time"),
    "debug_function": (_env_names("BYTEGRAPH_DEBUG_FUNCTION"), (list, tuple),
                       "compile only frames of functions with these names (BYTEGRAPH_DEBUG_FUNCTION=a,b); "
                       "empty: every frame"),
}

# setting name -> functions called with each new value; higher floors react to settings
# without config importing them (debug.logs watches log_topics).
_watchers = {}


def watch(name, on_change):
    """Call ``on_change(value)`` whenever setting ``name`` is assigned."""
    _watchers.setdefault(name, []).append(on_change)


class Config:
    """Settings for bytegraph. Assign attributes; unknown names are errors."""

    __slots__ = tuple(_SETTINGS)

    def __init__(self):
        for name, (default, _, _) in _SETTINGS.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name, value):
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
        object.__setattr__(self, name, value)
        for on_change in _watchers.get(name, ()):
            on_change(value)

    def __getattr__(self, name):
        known = ", ".join(sorted(_SETTINGS))
        raise ConfigError(f"bytegraph.config has no setting {name!r}; known settings: {known}")

    def as_dict(self):
        return {name: getattr(self, name) for name in _SETTINGS}

    @contextlib.contextmanager
    def patch(self, **changes):
        """Temporarily change settings: ``with config.patch(cache_size_limit=2): ...``"""
        old = {name: getattr(self, name) for name in changes}
        for name, value in changes.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in old.items():
                setattr(self, name, value)

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"bytegraph.config({body})"


config = Config()
