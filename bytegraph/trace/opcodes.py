"""One handler per normalised opcode.

``HANDLERS`` maps an opcode name to ``handler(frame, instruction)``. Opcodes
that exist only on some Python versions simply have rows that older or newer
versions never reach; no handler looks at the version.
"""
import builtins
import operator

from ..errors import Unsupported
from ..guards.sources import GlobalSource, ItemSource, ObjectSource
from ..values.base import (NULL, CellValue, ConstantValue, ContextManagerValue, DictValue,
                           ExitValue, FunctionValue, IteratorValue, ListValue, ObjectValue,
                           SuperValue, TupleValue)
from ..values.builder import TRUSTED_MODULE_PREFIXES, wrap
from . import attrs, calls, operators
from .iteration import iterate, unpack
from ..bytecode.versions import method_pair

HANDLERS = {}


def handler(*names):
    def register(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return register


# --- loads and stores ---------------------------------------------------------

@handler("LOAD_FAST")
def load_fast(f, ins):
    try:
        f.push(f.local(ins.argval))
    except KeyError:
        raise Unsupported(f"local variable {ins.argval!r} read before assignment") from None


@handler("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(f, ins):
    v = f.local(ins.argval) if ins.argval in f.locals else NULL
    f.locals.pop(ins.argval, None)
    f.push(v)


@handler("STORE_FAST")
def store_fast(f, ins):
    v = f.pop()
    if v is NULL:
        f.locals.pop(ins.argval, None)
    else:
        f.locals[ins.argval] = v


@handler("DELETE_FAST")
def delete_fast(f, ins):
    f.locals.pop(ins.argval, None)


@handler("LOAD_CONST")
def load_const(f, ins):
    f.push(ConstantValue(ins.argval))


@handler("LOAD_GLOBAL", "LOAD_NAME")
def load_global(f, ins):
    name = ins.argval
    tx = f.tx
    if name in f.globals:
        module_name = f.globals.get("__name__", "module")
        if f.globals is tx.root_globals:
            source = GlobalSource(name)
        elif module_name.split(".")[0] in TRUSTED_MODULE_PREFIXES:
            source = None   # globals of torch's and the standard library's own modules are fixed
        else:
            source = ItemSource(ObjectSource(f.globals, module_name + ".__dict__"), name)
        f.push(wrap(tx, f.globals[name], source))
        return
    b = f.globals.get("__builtins__", builtins)
    table = b if isinstance(b, dict) else b.__dict__
    if name not in table:
        raise Unsupported(f"name {name!r} is not defined")
    f.push(wrap(tx, table[name], None))


@handler("STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME")
def store_global(f, ins):
    raise Unsupported(f"assigning global {ins.argval!r} is not supported yet")


@handler("MAKE_CELL")
def make_cell(f, ins):
    f.cells[ins.argval] = CellValue(f.local(ins.argval) if ins.argval in f.locals else None)


@handler("LOAD_CLOSURE")
def load_closure(f, ins):
    f.push(f.cells[ins.argval])


@handler("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(f, ins):
    cell = f.cells[ins.argval]
    if isinstance(cell, CellValue):
        if cell.contents is None:
            raise Unsupported(f"free variable {ins.argval!r} read before assignment")
        f.push(cell.contents)
    else:
        try:
            contents = cell.cell.cell_contents
        except ValueError:
            raise Unsupported(f"free variable {ins.argval!r} read before assignment") from None
        f.push(wrap(f.tx, contents, cell.source))


@handler("STORE_DEREF")
def store_deref(f, ins):
    cell = f.cells[ins.argval]
    v = f.pop()
    if isinstance(cell, CellValue):
        cell.contents = v
    else:
        raise Unsupported(f"assigning nonlocal {ins.argval!r} of an enclosing function is not supported yet")


@handler("LOAD_ATTR")
def load_attr(f, ins):
    obj = f.pop()
    f.push(attrs.get_attr(f, obj, ins.argval))


@handler("LOAD_METHOD")
def load_method(f, ins):
    # Always the "attribute plus NULL" form, with the NULL where this Python version keeps it,
    # so a stack rebuilt for a resume function is one CALL accepts.
    obj = f.pop()
    f.stack.extend(method_pair(NULL, attrs.get_attr(f, obj, ins.argval)))


@handler("LOAD_SUPER_ATTR")
def load_super_attr(f, ins):
    # super().name: the stack holds super, the class cell's contents and the first argument.
    self_value = f.pop()
    cls = f.pop()
    f.pop()
    if not isinstance(cls, ObjectValue) or not isinstance(cls.obj, type):
        raise Unsupported("super() with a non-class first argument")
    value = attrs.get_attr(f, SuperValue(cls.obj, self_value), ins.argval)
    if ins.arg & 1:
        f.stack.extend(method_pair(NULL, value))
    else:
        f.push(value)


@handler("STORE_ATTR")
def store_attr(f, ins):
    obj = f.pop()
    value = f.pop()
    attrs.set_attr(f, obj, ins.argval, value)


@handler("DELETE_ATTR")
def delete_attr(f, ins):
    raise Unsupported(f"deleting attribute {ins.argval!r} is not supported yet")


@handler("IMPORT_NAME")
def import_name(f, ins):
    fromlist = f.pop()
    level = f.pop()
    mod = __import__(ins.argval, f.globals, None, fromlist.value, level.value)
    f.push(wrap(f.tx, mod, None))


@handler("IMPORT_FROM")
def import_from(f, ins):
    f.push(attrs.get_attr(f, f.stack[-1], ins.argval))


# --- stack manipulation --------------------------------------------------------

@handler("POP_TOP")
def pop_top(f, ins):
    f.pop()


@handler("PUSH_NULL")
def push_null(f, ins):
    f.push(NULL)


@handler("COPY")
def copy(f, ins):
    f.push(f.stack[-ins.arg])


@handler("SWAP")
def swap(f, ins):
    s = f.stack
    s[-1], s[-ins.arg] = s[-ins.arg], s[-1]


# --- operators -------------------------------------------------------------------

@handler("BINARY_OP")
def binary_op(f, ins):
    b = f.pop()
    a = f.pop()
    f.push(operators.binary(f, ins.argval, a, b))


@handler("COMPARE_OP")
def compare_op(f, ins):
    b = f.pop()
    a = f.pop()
    f.push(operators.compare(f, ins.argval, a, b))


@handler("IS_OP")
def is_op(f, ins):
    b = f.pop()
    a = f.pop()
    f.push(ConstantValue(operators.is_same(a, b) != bool(ins.arg)))


@handler("CONTAINS_OP")
def contains_op(f, ins):
    container = f.pop()
    item = f.pop()
    f.push(ConstantValue(operators.contains(f, container, item) != bool(ins.arg)))


@handler("UNARY_NEGATIVE")
def unary_negative(f, ins):
    f.push(operators.unary(f, operator.neg, f.pop()))


@handler("UNARY_POSITIVE")
def unary_positive(f, ins):
    f.push(operators.unary(f, operator.pos, f.pop()))


@handler("UNARY_INVERT")
def unary_invert(f, ins):
    f.push(operators.unary(f, operator.invert, f.pop()))


@handler("UNARY_NOT")
def unary_not(f, ins):
    f.push(ConstantValue(not operators.truth(f, f.pop())))


@handler("TO_BOOL")
def to_bool(f, ins):
    f.push(ConstantValue(operators.truth(f, f.pop())))


@handler("BINARY_SUBSCR")
def binary_subscr(f, ins):
    index = f.pop()
    obj = f.pop()
    f.push(operators.getitem(f, obj, index))


@handler("BINARY_SLICE")
def binary_slice(f, ins):
    stop = f.pop()
    start = f.pop()
    obj = f.pop()
    f.push(operators.getitem(f, obj, operators.make_slice(start, stop, ConstantValue(None))))


@handler("STORE_SUBSCR")
def store_subscr(f, ins):
    index = f.pop()
    obj = f.pop()
    value = f.pop()
    operators.setitem(f, obj, index, value)


@handler("STORE_SLICE")
def store_slice(f, ins):
    stop = f.pop()
    start = f.pop()
    obj = f.pop()
    value = f.pop()
    operators.setitem(f, obj, operators.make_slice(start, stop, ConstantValue(None)), value)


@handler("DELETE_SUBSCR")
def delete_subscr(f, ins):
    index = f.pop()
    obj = f.pop()
    operators.delitem(f, obj, index)


# --- building ----------------------------------------------------------------------

@handler("BUILD_TUPLE")
def build_tuple(f, ins):
    f.push(TupleValue(f.popn(ins.arg)))


@handler("BUILD_LIST")
def build_list(f, ins):
    f.push(ListValue(f.popn(ins.arg)))


@handler("BUILD_SET")
def build_set(f, ins):
    items = f.popn(ins.arg)
    f.push(operators.constant_fold(f, lambda *xs: set(xs), items, "set display"))


@handler("BUILD_MAP")
def build_map(f, ins):
    flat = f.popn(2 * ins.arg)
    keys = [operators.key_of(k) for k in flat[0::2]]
    f.push(DictValue(dict(zip(keys, flat[1::2]))))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(f, ins):
    keys = f.pop()
    values = f.popn(ins.arg)
    f.push(DictValue(dict(zip(keys.value, values))))


@handler("BUILD_SLICE")
def build_slice(f, ins):
    parts = f.popn(ins.arg)
    if len(parts) == 2:
        parts.append(ConstantValue(None))
    f.push(operators.make_slice(*parts))


@handler("BUILD_STRING")
def build_string(f, ins):
    parts = f.popn(ins.arg)
    f.push(operators.constant_fold(f, lambda *xs: "".join(xs), parts, "string building"))


@handler("FORMAT_VALUE")
def format_value(f, ins):
    flags = ins.arg
    spec = f.pop() if flags & 0x04 else ConstantValue("")
    value = f.pop()
    conv = {0: None, 1: str, 2: repr, 3: ascii}[flags & 0x03]
    def fmt(v, s):
        return format(conv(v) if conv else v, s)
    f.push(operators.constant_fold(f, fmt, [value, spec], "f-string formatting"))


@handler("FORMAT_SIMPLE")
def format_simple(f, ins):
    f.push(operators.constant_fold(f, format, [f.pop()], "f-string formatting"))


@handler("FORMAT_WITH_SPEC")
def format_with_spec(f, ins):
    spec = f.pop()
    value = f.pop()
    f.push(operators.constant_fold(f, format, [value, spec], "f-string formatting"))


@handler("CONVERT_VALUE")
def convert_value(f, ins):
    conv = {1: str, 2: repr, 3: ascii}[ins.arg]
    f.push(operators.constant_fold(f, conv, [f.pop()], "f-string conversion"))


@handler("LIST_APPEND")
def list_append(f, ins):
    v = f.pop()
    target = f.stack[-ins.arg]
    _require(target, ListValue, "LIST_APPEND").items.append(v)


@handler("SET_ADD")
def set_add(f, ins):
    v = f.pop()
    _new_set(f.stack[-ins.arg], "SET_ADD").add(operators.as_constant(v))


@handler("MAP_ADD")
def map_add(f, ins):
    v = f.pop()
    k = f.pop()
    _require(f.stack[-ins.arg], DictValue, "MAP_ADD").items[operators.key_of(k)] = v


@handler("LIST_EXTEND")
def list_extend(f, ins):
    v = f.pop()
    _require(f.stack[-ins.arg], ListValue, "LIST_EXTEND").items.extend(iterate(f, v))


@handler("SET_UPDATE")
def set_update(f, ins):
    v = f.pop()
    _new_set(f.stack[-ins.arg], "SET_UPDATE").update(operators.as_constant(x) for x in iterate(f, v))


@handler("LIST_TO_TUPLE")
def list_to_tuple(f, ins):
    f.push(TupleValue(_require(f.pop(), ListValue, "LIST_TO_TUPLE").items))


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(f, ins):
    v = f.pop()
    target = _require(f.stack[-ins.arg], DictValue, ins.opname)
    if isinstance(v, DictValue):
        if ins.opname == "DICT_MERGE":
            dup = set(target.items) & set(v.items)
            if dup:
                raise Unsupported(f"keyword argument repeated: {sorted(dup)[0]!r}")
        target.items.update(v.items)
    elif isinstance(v, ConstantValue) and isinstance(v.value, dict):
        target.items.update({k: ConstantValue(x) for k, x in v.value.items()})
    else:
        raise Unsupported(f"** of {attrs.describe(v)} is not supported yet")


def _new_set(v, what):
    """The set a set display is building (sets are kept as constants)."""
    if not isinstance(v, ConstantValue) or v.source is not None or not isinstance(v.value, set):
        raise Unsupported(f"{what} on an existing set is not supported yet")
    return v.value


def _require(v, cls, what):
    if not isinstance(v, cls):
        raise Unsupported(f"{what} on {attrs.describe(v)} is not supported yet")
    if v.source is not None:
        # A container that exists outside the trace (e.g. handed to a resume function):
        # changing it is a side effect the trace does not replay.
        raise Unsupported(f"{what} on an existing {cls.__name__.replace('Value', '').lower()} "
                          "(a side effect) is not supported yet")
    return v


@handler("UNPACK_SEQUENCE")
def unpack_sequence(f, ins):
    items = unpack(f, f.pop(), ins.arg)
    f.stack.extend(reversed(items))


@handler("UNPACK_EX")
def unpack_ex(f, ins):
    before = ins.arg & 0xFF
    after = ins.arg >> 8
    items = iterate(f, f.pop())
    if len(items) < before + after:
        raise Unsupported(f"not enough values to unpack (expected at least {before + after}, got {len(items)})")
    middle = ListValue(items[before:len(items) - after])
    out = items[:before] + [middle] + items[len(items) - after:]
    f.stack.extend(reversed(out))


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
    f.push(v if isinstance(v, IteratorValue) else IteratorValue(iterate(f, v)))


@handler("FOR_ITER")
def for_iter(f, ins):
    it = f.stack[-1]
    if not isinstance(it, IteratorValue):
        raise Unsupported(f"iterating over {attrs.describe(it)} is not supported yet")
    if it.pos < len(it.items):
        f.push(it.items[it.pos])
        it.pos += 1
    else:
        f.pop()
        f.jump(ins)


@handler("RETURN_VALUE")
def return_value(f, ins):
    f.return_value = f.pop()
    f.done = True


@handler("RETURN_GENERATOR")
def return_generator(f, ins):
    f.push(ConstantValue(None))


@handler("YIELD_VALUE")
def yield_value(f, ins):
    if f.yielded is None:
        raise Unsupported("yield outside a generator being consumed")
    f.yielded.append(f.pop())
    f.push(ConstantValue(None))


@handler("RAISE_VARARGS")
def raise_varargs(f, ins):
    exc = f.stack[-1] if ins.arg else None
    what = attrs.describe(exc) if exc is not None else "a re-raise"
    raise Unsupported(f"the traced code raises {what}",
                      hint="an exception raised inside the compiled function runs it eagerly")


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(f, ins):
    f.push(ObjectValue(AssertionError))


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
    from ..bytecode.versions import split_call_prefix
    fn, self_value = split_call_prefix(below, above)
    if self_value is not None:
        args = [self_value] + args
    if kw:
        kwargs = dict(zip(kw, args[len(args) - len(kw):]))
        args = args[:len(args) - len(kw)]
    else:
        kwargs = {}
    f.push(calls.call(f, fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(f, ins):
    kwargs = f.pop() if ins.arg & 1 else DictValue({})
    args = f.pop()
    below, above = f.popn(2)
    from ..bytecode.versions import split_call_prefix
    fn, self_value = split_call_prefix(below, above)
    arg_list = iterate(f, args)
    if self_value is not None:
        arg_list = [self_value] + arg_list
    if not isinstance(kwargs, DictValue):
        raise Unsupported(f"** of {attrs.describe(kwargs)} is not supported yet")
    f.push(calls.call(f, fn, arg_list, dict(kwargs.items)))


@handler("MAKE_FUNCTION")
def make_function(f, ins):
    code = f.pop().value
    flags = ins.arg or 0
    closure = f.pop().items if flags & 0x08 else ()
    if flags & 0x04:
        f.pop()
    kwdefaults = dict(f.pop().items) if flags & 0x02 else {}
    defaults = f.pop() if flags & 0x01 else ()
    if isinstance(defaults, ConstantValue):   # a LOAD_CONST tuple of defaults
        defaults = [ConstantValue(x) for x in defaults.value]
    elif defaults:
        defaults = defaults.items
    f.push(FunctionValue(code, f.globals, code.co_name, code.co_qualname, defaults, kwdefaults, closure))


@handler("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(f, ins):
    fn = f.pop()
    value = f.pop()
    if ins.arg == 0x08:
        fn.closure = tuple(value.items)
    elif ins.arg == 0x02:
        fn.kwdefaults = dict(value.items)
    elif ins.arg == 0x01:
        fn.defaults = tuple(value.items) if isinstance(value, TupleValue) else tuple(
            ConstantValue(x) for x in value.value)
    f.push(fn)


# --- with blocks --------------------------------------------------------------------------

@handler("BEFORE_WITH")
def before_with(f, ins):
    mgr = f.pop()
    if not isinstance(mgr, ContextManagerValue):
        raise Unsupported(f"with-block on {attrs.describe(mgr)} is not supported yet")
    calls.enter_context(f, mgr)
    f.push(ExitValue(mgr))
    f.push(ConstantValue(None))
