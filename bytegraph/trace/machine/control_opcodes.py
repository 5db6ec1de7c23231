"""The opcodes that move control: jumps, loops, returns and yields, ``match`` statements,
exceptions, calls and ``with`` blocks.

They register into ``opcodes.HANDLERS`` like the opcodes that move data (``opcodes``).
"""
from ...errors import Unsupported
from ...values.base import (ConstantValue, ContextManagerValue, DictValue, ExceptionValue, ExitValue, FunctionValue,
                           GeneratorValue, IteratorValue, ObjectValue, SavedExcInfoValue, TupleValue)
from ...values.builder import wrap
from . import patterns, with_blocks
from ..callables import calls
from ..python import attrs, exceptions, generators, lookup, operators
from ..torch_api import torch_calls
from ..python.generators import check_unchanged
from ..python.iteration import iterate
from ...bytecode.instructions import FUNCTION_ANNOTATIONS, FUNCTION_CLOSURE, FUNCTION_DEFAULTS, FUNCTION_KWDEFAULTS
from ...bytecode.versions import send_returned, split_call_prefix
from .opcodes import mapping_items, handler


# --- control flow ----------------------------------------------------------------------

@handler("JUMP")
def jump(f, ins):
    f.jump(ins)


@handler("POP_JUMP_IF_FALSE")
def pop_jump_if_false(f, ins):
    if not operators.truth(f, f.pop()):
        f.jump(ins)


@handler("POP_JUMP_IF_TRUE")
def pop_jump_if_true(f, ins):
    if operators.truth(f, f.pop()):
        f.jump(ins)


@handler("POP_JUMP_IF_NONE")
def pop_jump_if_none(f, ins):
    if operators.is_none(f.pop()):
        f.jump(ins)


@handler("POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(f, ins):
    if not operators.is_none(f.pop()):
        f.jump(ins)


@handler("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(f, ins):
    if not operators.truth(f, f.stack[-1]):
        f.jump(ins)
    else:
        f.pop()


@handler("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(f, ins):
    if operators.truth(f, f.stack[-1]):
        f.jump(ins)
    else:
        f.pop()


@handler("GET_ITER")
def get_iter(f, ins):
    v = f.pop()
    f.push(generators.get_iter(f, v))


@handler("FOR_ITER")
def for_iter(f, ins):
    it = f.stack[-1]
    if isinstance(it, IteratorValue):
        check_unchanged(it)
        if it.pos < len(it.items):
            f.push(it.items[it.pos])
            it.pos += 1
            return
        item = generators.EXHAUSTED
    elif generators.is_lazy(it) or generators.has_python_next(it):
        item = generators.next_item(f, it)
    else:
        raise Unsupported(f"iterating over {attrs.describe(it)} is not supported yet")
    if item is generators.EXHAUSTED:
        f.pop()
        f.jump(ins)
    else:
        f.push(item)


@handler("RETURN_VALUE")
def return_value(f, ins):
    f.return_value = f.pop()
    f.done = True


@handler("RETURN_GENERATOR")
def return_generator(f, ins):
    f.push(ConstantValue(None))


@handler("YIELD_VALUE")
def yield_value(f, ins):
    if f.generator is None:
        raise Unsupported("yield outside a generator frame")
    f.yielded = f.pop()
    f.yield_index = ins.index
    f.yield_from = ins.index > 0 and f.instructions[ins.index - 1].opname == "SEND"
    f.suspended = True
    f.done = True


@handler("GET_YIELD_FROM_ITER")
def get_yield_from_iter(f, ins):
    f.push(generators.get_iter(f, f.pop()))


@handler("SEND")
def send(f, ins):
    value = f.pop()
    receiver = f.stack[-1]
    if isinstance(receiver, GeneratorValue):
        kind, result = generators.resume(receiver, sent=value)
    elif operators.is_none(value):
        result = generators.next_item(f, receiver)
        kind = "return" if result is generators.EXHAUSTED else "yield"
        if kind == "return":
            result = ConstantValue(None)
    else:
        raise Unsupported(f"send() to {attrs.describe(receiver)} is not supported yet")
    if kind == "yield":
        f.push(result)
    else:
        send_returned(f.stack, result)
        f.jump(ins)


@handler("END_SEND")
def end_send(f, ins):
    del f.stack[-2]


@handler("CLEANUP_THROW")
def cleanup_throw(f, ins):
    exc = f.stack[-1]
    if isinstance(exc, ExceptionValue) and issubclass(exc.cls, StopIteration):
        del f.stack[-3:]
        f.push(lookup.exception_attr(f, exc, "value"))
    else:
        raise exceptions.TracedRaise(f.pop())


@handler("STOPITERATION_ERROR")
def stopiteration_error(f, ins):
    exc = f.pop()
    if isinstance(exc, ExceptionValue) and issubclass(exc.cls, StopIteration):
        err = exceptions.new(RuntimeError, "generator raised StopIteration")
        err.cause = err.context = exc
        err.suppress_context = True
        exc = err
    f.push(exc)


# --- match statements ----------------------------------------------------------------------

@handler("MATCH_SEQUENCE")
def match_sequence(f, ins):
    f.push(ConstantValue(patterns.is_sequence(f.stack[-1])))


@handler("MATCH_MAPPING")
def match_mapping(f, ins):
    f.push(ConstantValue(patterns.is_mapping(f.stack[-1])))


@handler("MATCH_KEYS")
def match_keys(f, ins):
    f.push(patterns.match_keys(f, f.stack[-2], f.stack[-1]))


@handler("MATCH_CLASS")
def match_class(f, ins):
    names = f.pop()
    cls = f.pop()
    subject = f.pop()
    f.push(patterns.match_class(f, subject, cls, ins.arg, operators.as_constant(names)))


@handler("GET_LEN")
def get_len(f, ins):
    f.push(calls.call(f, wrap(f.tx, len, None), [f.stack[-1]], {}))


# --- exceptions --------------------------------------------------------------------------

@handler("RAISE_VARARGS")
def raise_varargs(f, ins):
    if ins.arg == 0:
        exceptions.reraise_current(f)
    if ins.arg == 2:
        cause = f.pop()
        exceptions.raise_value(f, f.pop(), cause, has_cause=True)
    exceptions.raise_value(f, f.pop())


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(f, ins):
    f.push(ObjectValue(AssertionError))


@handler("PUSH_EXC_INFO")
def push_exc_info(f, ins):
    exc = f.pop()
    f.push(SavedExcInfoValue(f.tx.handled_exception))
    f.tx.handled_exception = exc
    f.push(exc)


@handler("POP_EXCEPT")
def pop_except(f, ins):
    saved = f.pop()
    if not isinstance(saved, SavedExcInfoValue):
        raise Unsupported("POP_EXCEPT without a saved exception state")
    f.tx.handled_exception = saved.prev


@handler("CHECK_EXC_MATCH")
def check_exc_match(f, ins):
    classes = f.pop()
    exceptions.guard_class(f.tx, f.stack[-1])
    f.push(ConstantValue(exceptions.matches(f.stack[-1], classes)))


@handler("RERAISE")
def reraise(f, ins):
    exc = f.pop()
    if not isinstance(exc, ExceptionValue):
        raise Unsupported("re-raising a value that is not a traced exception")
    raise exceptions.TracedRaise(exc)


@handler("WITH_EXCEPT_START")
def with_except_start(f, ins):
    exc = f.stack[-1]
    exit_fn = f.stack[-4]
    f.push(with_blocks.call_exit(f, exit_fn, exc))


# --- calls ------------------------------------------------------------------------------

@handler("KW_NAMES")
def kw_names(f, ins):
    f.kw_names = ins.argval


@handler("CALL")
def call(f, ins):
    kw = f.kw_names or ()
    f.kw_names = None
    _do_call(f, ins.arg, kw)


@handler("CALL_KW")
def call_kw(f, ins):
    kw = f.pop().value
    _do_call(f, ins.arg, kw)


def _do_call(f, argc, kw):
    args = f.popn(argc)
    below, above = f.popn(2)
    fn, self_value = split_call_prefix(below, above)
    if self_value is not None:
        args = [self_value] + args
    if kw:
        kwargs = dict(zip(kw, args[len(args) - len(kw):]))
        args = args[:len(args) - len(kw)]
    else:
        kwargs = {}
    f.callee = fn     # what a frame inlined by this call was called through (stdlib_calls: warnings)
    f.push(calls.call(f, fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(f, ins):
    kwargs = f.pop() if ins.arg & 1 else DictValue({})
    args = f.pop()
    below, above = f.popn(2)
    fn, self_value = split_call_prefix(below, above)
    arg_list = iterate(f, args)
    if self_value is not None:
        arg_list = [self_value] + arg_list
    f.push(calls.call(f, fn, arg_list, dict(kwargs.items) if isinstance(kwargs, DictValue) else mapping_items(f, kwargs)))


@handler("MAKE_FUNCTION")
def make_function(f, ins):
    code = f.pop().value
    flags = ins.arg or 0
    closure = f.pop().items if flags & FUNCTION_CLOSURE else ()
    if flags & FUNCTION_ANNOTATIONS:
        f.pop()
    kwdefaults = dict(f.pop().items) if flags & FUNCTION_KWDEFAULTS else {}
    defaults = f.pop() if flags & FUNCTION_DEFAULTS else ()
    if isinstance(defaults, ConstantValue):   # a LOAD_CONST tuple of defaults
        defaults = [ConstantValue(x) for x in defaults.value]
    elif defaults:
        defaults = defaults.items
    f.push(FunctionValue(code, f.globals, code.co_name, code.co_qualname, defaults, kwdefaults, closure))


@handler("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(f, ins):
    fn = f.pop()
    value = f.pop()
    if ins.arg == FUNCTION_CLOSURE:
        fn.closure = tuple(value.items)
    elif ins.arg == FUNCTION_KWDEFAULTS:
        fn.kwdefaults = dict(value.items)
    elif ins.arg == FUNCTION_DEFAULTS:
        fn.defaults = tuple(value.items) if isinstance(value, TupleValue) else tuple(
            ConstantValue(x) for x in value.value)
    f.push(fn)


# --- with blocks --------------------------------------------------------------------------

@handler("BEFORE_WITH")
def before_with(f, ins):
    mgr = f.pop()
    mgr = torch_calls.manager_of(f, mgr) or mgr
    if isinstance(mgr, ContextManagerValue):
        calls.enter_context(f, mgr)
        f.push(ExitValue(mgr))
        f.push(ConstantValue(None))
        return
    exit_fn, entered = with_blocks.enter(f, mgr)
    f.push(exit_fn)
    f.push(entered)
