"""Record and replay of a frame whose tracing hit an internal error.

With ``config.replay_record_enabled`` (``BYTEGRAPH_REPLAY_RECORD=1``), an internal error
while tracing a frame (a bug in bytegraph, not an unsupported construct) writes a record:

- the frame's code object (``marshal``) and its function's name, module and defaults;
- the globals its code (and the code nested in it) names, as they were;
- the closure's contents and the argument values: tensors saved up to a size (bigger ones
  as their shape, dtype and strides, rebuilt at random), other objects pickled where they
  can be, else left to be found again by importing the function's module;
- the module search path, and the error with its traceback.

``bytegraph.replay(path)`` (in a fresh process: ``python -c "import bytegraph;
bytegraph.replay('...')"``) rebuilds the function and its arguments from the record and
compiles that one frame again with errors not suppressed, so the internal error is raised
with bytegraph's own traceback, ready for a debugger.
"""
import builtins
import io
import importlib
import importlib.util
import inspect
import marshal
import os
import pickle
import platform
import sys
import traceback
import types

import torch

from ..errors import BytegraphError
from .debug_dir import output_dir
from .repro import Input

FORMAT = "bytegraph-replay/1"
MAX_SAVED_BYTES = 64 << 20      # bigger tensors are recorded by their metadata only


class _Missing:
    """A value the record could not keep: its description, found again by name on replay."""

    def __init__(self, description):
        self.description = description

    def __repr__(self):
        return f"<not recorded: {self.description}>"


class _Module:
    def __init__(self, name):
        self.name = name


class _TensorMeta:
    def __init__(self, spec):
        self.spec = spec


def record_directory():
    return output_dir("replay_record_dir", "replay", "bytegraph_replay")


def write_record(fn, frame_args, error):
    """Write the record of ``fn`` called with ``frame_args`` (values of its parameters, in
    ``co_varnames`` order) that failed with ``error``; return its path."""
    code = fn.__code__
    module = sys.modules.get(fn.__module__) if isinstance(fn.__module__, str) else None
    objects = {
        "globals": {name: _pack(fn.__globals__[name]) for name in sorted(_names_read(code))
                    if name in fn.__globals__},
        "closure": None if fn.__closure__ is None else [_pack(_cell_contents(c)) for c in fn.__closure__],
        "defaults": _pack(fn.__defaults__),
        "kwdefaults": _pack(fn.__kwdefaults__),
        "args": [_pack(v) for v in frame_args],
    }
    payload = io.BytesIO()
    torch.save(objects, payload)
    record = {
        "format": FORMAT,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "code": marshal.dumps(code),
        "name": fn.__name__,
        "qualname": fn.__qualname__,
        "module": fn.__module__,
        "module_file": getattr(module, "__file__", None),
        "sys_path": [p for p in sys.path if isinstance(p, str)],
        "cwd": os.getcwd(),
        "payload": payload.getvalue(),
        "error": {"type": type(error).__name__, "message": str(error),
                  "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))},
    }
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in fn.__qualname__)[:60]
    directory = record_directory()
    n = 1
    while os.path.exists(os.path.join(directory, f"replay_{name}_{n}.pt")):
        n += 1
    path = os.path.join(directory, f"replay_{name}_{n}.pt")
    torch.save(record, path)
    return path


def _names_read(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
    return names


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _Missing("an empty cell")


def _pack(value):
    if isinstance(value, types.ModuleType):
        return _Module(value.__name__)
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        if value.numel() * value.element_size() > MAX_SAVED_BYTES or value.device.type == "meta":
            return _TensorMeta(Input.of(value))
        return value.detach().clone().requires_grad_(value.requires_grad) if value.is_leaf else value.detach()
    if isinstance(value, tuple):
        return tuple(_pack(v) for v in value)
    if isinstance(value, list) and type(value) is list:
        return [_pack(v) for v in value]
    if isinstance(value, dict) and type(value) is dict:
        return {k: _pack(v) for k, v in value.items()}
    try:
        pickle.dumps(value)
    except Exception as e:
        return _Missing(f"{type(value).__name__} object ({type(e).__name__}: {e})")
    return value


def _unpack(value, name, module):
    if isinstance(value, _Module):
        return importlib.import_module(value.name)
    if isinstance(value, _TensorMeta):
        return value.spec.make()
    if isinstance(value, tuple):
        return tuple(_unpack(v, name, module) for v in value)
    if isinstance(value, list):
        return [_unpack(v, name, module) for v in value]
    if isinstance(value, dict):
        return {k: _unpack(v, name, module) for k, v in value.items()}
    if isinstance(value, _Missing):
        if module is not None and name is not None and hasattr(module, name):
            return getattr(module, name)
        raise BytegraphError(f"replay: {name or 'a value'} was not recorded ({value.description}) and "
                             "cannot be found again")
    return value


def load(path):
    """The record at ``path``. Its header (plain data) is read first, to make the function's
    module importable before the recorded objects, which may need it, are unpickled."""
    if not os.path.exists(path):
        raise BytegraphError(f"replay: no record at {path!r}")
    try:
        header = torch.load(path, weights_only=True)
    except Exception as e:
        raise BytegraphError(f"replay: {path!r} is not a bytegraph replay record ({type(e).__name__})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BytegraphError(f"replay: {path!r} is not a bytegraph replay record")
    if header["python"].rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        raise BytegraphError(f"replay: the record was made by Python {header['python']}; its bytecode needs the "
                             f"same Python version (this is {platform.python_version()})")
    for entry in reversed(header["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return dict(header)


class _Unpickler(pickle.Unpickler):
    """Objects of a script run as ``__main__`` come from that script, loaded as a module."""
    main_module = None

    def find_class(self, module, name):
        if module == "__main__" and self.main_module is not None:
            module = self.main_module
        return super().find_class(module, name)


class _PickleModule:
    """What torch.load calls ``pickle_module``: pickle, with the unpickler above."""
    Unpickler = _Unpickler
    load = staticmethod(pickle.load)
    __name__ = "pickle"


def rebuild(record):
    """(function, positional args, keyword args) to call the recorded frame again."""
    module = _import_module(record)
    _Unpickler.main_module = module.__name__ if module is not None and record["module"] == "__main__" else None
    record = dict(record)
    record.update(torch.load(io.BytesIO(record["payload"]), weights_only=False, pickle_module=_PickleModule))
    fn_globals = dict(module.__dict__) if module is not None else {"__name__": record["module"]}
    fn_globals.setdefault("__builtins__", builtins)
    for name, value in record["globals"].items():
        fn_globals[name] = _unpack(value, name, module)
    code = marshal.loads(record["code"])
    closure = None
    if record["closure"] is not None:
        closure = tuple(types.CellType(_unpack(v, None, None)) for v in record["closure"])
    fn = types.FunctionType(code, fn_globals, record["name"], _unpack(record["defaults"], None, None), closure)
    fn.__kwdefaults__ = _unpack(record["kwdefaults"], None, None)
    fn.__qualname__ = record["qualname"]
    fn.__module__ = record["module"]
    # The frame's values, in co_varnames order: positional, keyword-only, *args, **kwargs.
    values = [_unpack(v, None, None) for v in record["args"]]
    n_pos, n_kw = code.co_argcount, code.co_kwonlyargcount
    args = list(values[:n_pos])
    kwargs = dict(zip(code.co_varnames[n_pos:n_pos + n_kw], values[n_pos:n_pos + n_kw]))
    i = n_pos + n_kw
    if code.co_flags & inspect.CO_VARARGS:
        args += list(values[i])
        i += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[i])
    return fn, args, kwargs


def _import_module(record):
    """The function's module, imported; a script run as ``__main__`` is loaded from its file
    under another name (its ``if __name__ == "__main__":`` block does not run)."""
    name, file = record["module"], record["module_file"]
    if not name or name == "__main__":
        name = "_bytegraph_replayed_main" if name == "__main__" else None
    if name is not None:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    if file and os.path.exists(file):
        spec = importlib.util.spec_from_file_location(name or "_bytegraph_replayed", file)
        module = importlib.util.module_from_spec(spec)
        if name is not None:
            sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return None
