"""One frame of symbolic execution: locals, stack, instruction pointer, and the loop.

The root frame is the compiled function; inlined calls run in child frames
that share the TraceContext. Opcode handlers live in ``opcodes.py``.
"""
from __future__ import annotations

import inspect
import types

from ...bytecode.analysis import live_locals
from ...bytecode.instructions import decode
from ...errors import Unsupported
from ...graph import unbacked
from ...values.base import CellValue, ConstantValue, DictValue, TupleValue, Value
from ...values.builder import wrap
from ..core import ops
from ..core.context import MAX_INLINE_DEPTH
from ..python.exceptions import TracedRaise, break_index, converted, escape_error, handled, unwind
from ..python.generators import check_finished_generators, make_generator
from . import checkpoint

_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class PendingLocal:
    """An argument not read yet: wrapped (and guarded) only when the code reads it."""
    __slots__ = ("obj", "source")

    def __init__(self, obj, source):
        self.obj = obj
        self.source = source


class Frame:
    def __init__(self, tx, code, fn_globals, local_values, cells, parent=None):
        self.tx = tx
        self.code = code
        self.globals = fn_globals
        self.locals = local_values        # name -> value
        self.cells = cells                # name -> CellValue or RealCell
        self.parent = parent
        self.instructions = decode(code)
        self.stack = []
        self.ip = 0
        self.current = None
        self.kw_names = None
        self.return_value = None
        self.done = False
        self.generator = None     # the GeneratorValue running this frame, for generator frames
        self.yielded = None       # the value a generator frame just yielded
        self.suspended = False    # a generator frame stopped at a yield
        self.yield_index = None   # index of that YIELD_VALUE (throw() raises there)
        self.yield_from = False   # ... and it is the yield of a `yield from` loop
        self.own_handled = None   # a generator frame's handled exception while suspended
        self.stop_before = None   # root frame only: stop when about to run this instruction index
        self.fresh_containers = ()  # root frame only: names of its *args / **kwargs parameters
        self.stopped = False
        # Root frame only: a set (the rows checkpointed so far) to keep a checkpoint.Checkpoint
        # before each row that may break; None: none.
        self.checkpoints = None
        self.checkpoint = None
        self.callee = None        # the callable of the CALL running now (opcodes._do_call)

    def run(self) -> Value | None:
        HANDLERS = ops.HANDLERS
        tx = self.tx
        tx.frames.append(self)
        try:
            instructions = self.instructions
            stop_before = self.stop_before
            checkpoints = self.checkpoints
            while not self.done:
                if self.ip == stop_before:
                    self.stopped = True
                    self.check_stop()
                    return None
                ins = instructions[self.ip]
                if checkpoints is not None and ins.opname not in checkpoint.PLAIN and (
                        self.ip == 0 or instructions[self.ip - 1].offset != ins.offset):
                    self.checkpoint = checkpoint.take(self, self.ip, checkpoints)
                self.ip += 1
                self.current = ins
                tx.instructions_left -= 1
                if tx.instructions_left < 0:
                    raise Unsupported("trace too long (an unbounded or very long loop?)",
                                      hint="mark the loop's function with bytegraph.disable, or shorten it")
                handler = HANDLERS.get(ins.opname)
                if handler is None:
                    raise Unsupported(f"opcode {ins.opname} is not supported yet")
                try:
                    handler(self, ins)
                except TracedRaise as e:
                    self._raise_here(e.value, ins)
                except Unsupported as e:
                    value = converted(e)
                    if value is None:
                        raise
                    self._raise_here(value, ins)
                except unbacked.GuardOnDataDependentSymNode as e:
                    # A Python decision on a number only the graph knows: break at this instruction.
                    raise unbacked.guard_break(e) from e
            if self.parent is None:
                check_finished_generators(tx, [self.return_value])
            return self.return_value
        except TracedRaise as e:
            if self.parent is None:
                err = escape_error(e.value)
                err.user_stack = tx.user_stack(e.value.raised_at)
                raise err from None
            raise
        except Unsupported as e:
            if not e.user_stack:
                e.user_stack = tx.user_stack()
            if e.frames is None:   # issue 40: runtime.compile_frame's break hints
                e.frames = list(tx.frames) if handled(tx) is None else []
            if self.parent is None and e.root_index is None:
                e.root_index = break_index(self) if self.current is not None else None
            raise
        except Exception as e:
            # A bug of ours: keep where in the user's code it happened, for the message.
            if not hasattr(e, "_bytegraph_user_stack"):
                e._bytegraph_user_stack = tx.user_stack()
            raise
        finally:
            tx.frames.pop()

    def check_stop(self):
        """The root frame stops before its current row (a break): generators dropped there would
        be closed natively later."""
        live = live_locals(self.code, self.instructions[self.ip].offset)
        check_finished_generators(self.tx, self.stack + [v for n, v in self.locals.items() if n in live] + [
            c.contents for c in self.cells.values() if isinstance(c, CellValue)])

    def _raise_here(self, value, ins):
        """The instruction ``ins`` raised ``value``: go to its handler, or leave the frame."""
        if self.parent is None and value.root_index is None:
            value.root_index = ins.index
        if value.raised_at is None:
            value.raised_at = self.tx.stack_snapshot()
        if not unwind(self, value, ins.index):
            raise TracedRaise(value)

    # stack helpers
    def local(self, name):
        v = self.locals[name]
        if type(v) is PendingLocal:
            v = self.locals[name] = wrap(self.tx, v.obj, v.source)
            if name in self.fresh_containers and v.source is not None:
                # *args / **kwargs are built anew by each call: changing them is no side effect.
                # Their items keep their sources (and guards).
                v.source = None
                self.tx.effects.existing_containers.pop(id(v), None)
        return v

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, ins):
        self.ip = ins.target


def bind_arguments(code, name, defaults, kwdefaults, args, kwargs):
    """Map call arguments onto a code object's parameters, as CPython would."""
    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound = {}
    if len(args) > nargs and not has_varargs:
        raise Unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    for i, a in enumerate(args[:nargs]):
        bound[names[i]] = a
    extra_kw = {}
    kwonly = names[nargs:nargs + nkwonly]
    for k, v in kwargs.items():
        if k in names[nposonly:nargs] or k in kwonly:
            if k in bound:
                raise Unsupported(f"{name}() got multiple values for argument {k!r}")
            bound[k] = v
        elif has_varkw:
            extra_kw[k] = v
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {k!r}")
    ndefaults = len(defaults)
    for i in range(nargs):
        pname = names[i]
        if pname not in bound:
            j = i - (nargs - ndefaults)
            if j < 0:
                raise Unsupported(f"{name}() missing required argument {pname!r}")
            bound[pname] = defaults[j]
    for pname in kwonly:
        if pname not in bound:
            if pname not in kwdefaults:
                raise Unsupported(f"{name}() missing required keyword-only argument {pname!r}")
            bound[pname] = kwdefaults[pname]
    pos = nargs + nkwonly
    if has_varargs:
        bound[names[pos]] = TupleValue(args[nargs:])
        pos += 1
    if has_varkw:
        bound[names[pos]] = DictValue(extra_kw)
    return bound


def inline_call(parent: Frame, code: types.CodeType, fn_globals: dict, name: str, defaults, kwdefaults, closure,
                args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Run a Python function's code in a child frame; return its result value."""
    tx = parent.tx
    if code.co_flags & (_GENERATOR_FLAGS & ~inspect.CO_GENERATOR):
        raise Unsupported(f"calling coroutine function {name}() is not supported yet")
    if len(tx.frames) > MAX_INLINE_DEPTH:
        raise Unsupported(f"call depth over {MAX_INLINE_DEPTH} while inlining {name}() (recursion?)")
    if parent.parent is None and tx.known_breaks and handled(tx) is None:
        known = tx.known_breaks.get(parent.current.index)
        if known is not None and known.code is code:
            # An earlier trace broke inside this call, at this call site: stop at the call
            # now instead of tracing the callee again down to the same break.
            raise known.error(tx)
    local_values = bind_arguments(code, name, defaults, kwdefaults, args, kwargs)
    tx.inlined_codes[code] = fn_globals.get("__name__")   # what the persistent cache fingerprints
    cells = dict(zip(code.co_freevars, closure))   # cellvars are made by MAKE_CELL
    frame = Frame(tx, code, fn_globals, local_values, cells, parent)
    if code.co_flags & inspect.CO_GENERATOR:
        # Lazy, as in Python: the body runs a step at a time as the generator is consumed.
        return make_generator(frame, name)
    return frame.run()


def constant_or_none(v):
    return v.value if isinstance(v, ConstantValue) else None
