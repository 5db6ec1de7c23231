"""One handler per normalised opcode; here the opcodes that move data: loads and stores, the
stack, operators, building containers and strings.

``HANDLERS`` maps an opcode name to ``handler(frame, instruction)``. Opcodes
that exist only on some Python versions simply have rows that older or newer
versions never reach; no handler looks at the version.
"""
import builtins
import operator


from ...errors import Unsupported
from ...null import NULL
from ...guards.builder import HAS_ATTR
from ...guards.sources import AttrSource, GlobalSource, ItemSource, ObjectSource
from ...values.base import (CellValue, ConstantValue, DictValue, FormattedTextValue, ListValue, ObjectValue, SuperValue,
                           TupleValue)
from ...values.builder import TRUSTED_MODULE_PREFIXES, wrap
from ..core.context import DELETED
from ..callables import calls
from ..python import attrs, exceptions, generators, operators, protocols
from ..core.basics import held_item
from ..python.iteration import iterate, unpack
from ...bytecode.instructions import FORMAT_CONVERSION_MASK, FORMAT_WITH_SPEC
from ...bytecode.versions import method_pair

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


def _global_source(f, name):
    """Where global ``name`` of the running frame is read from (None: taken as fixed)."""
    if f.globals is f.tx.root_globals:
        return GlobalSource(name)
    module_name = f.globals.get("__name__", "module")
    if module_name.split(".")[0] in TRUSTED_MODULE_PREFIXES:
        return None   # globals of torch's and the standard library's own modules are fixed
    return ItemSource(ObjectSource(f.globals, module_name + ".__dict__"), name)


@handler("LOAD_GLOBAL", "LOAD_NAME")
def load_global(f, ins):
    name = ins.argval
    tx = f.tx
    stored = tx.effects.global_stores.get((id(f.globals), name))
    if stored is not None and stored[1] is not DELETED:
        f.push(stored[1])   # assigned earlier in this trace
        return
    if name in f.globals and stored is None:
        f.push(wrap(tx, f.globals[name], _global_source(f, name)))
        return
    b = f.globals.get("__builtins__", builtins)
    table = b if isinstance(b, dict) else b.__dict__
    if name not in table:
        raise Unsupported(f"name {name!r} is not defined")
    f.push(wrap(tx, table[name], None))


@handler("STORE_GLOBAL", "DELETE_GLOBAL")
def store_global(f, ins):
    """Recorded (later reads in the trace see it) and done for real after the graph."""
    name = ins.argval
    source = _global_source(f, name)
    if source is None:
        # A library module's own flag (torch.backends' __allow_nonbracketed_mutation): its globals
        # are read unguarded, but a store is replayed like any other.
        source = ItemSource(ObjectSource(f.globals, f.globals.get("__name__", "module") + ".__dict__"), name)
    key = (id(f.globals), name)
    if ins.opname == "STORE_GLOBAL":
        value = f.pop()
    else:
        stored = f.tx.effects.global_stores.get(key)
        exists = stored[1] is not DELETED if stored is not None else name in f.globals
        if not exists:
            raise Unsupported(f"del of global {name!r}, which is not defined, raises NameError")
        if stored is None:
            # Guard that it exists, as the trace relies on it.
            current = wrap(f.tx, f.globals[name], source)
            if isinstance(current, ConstantValue):
                current.value
        value = DELETED
    f.tx.effects.store_global(key, source, value)


@handler("STORE_NAME")
def store_name(f, ins):
    raise Unsupported(f"assigning name {ins.argval!r} at module or class level is not supported yet")


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
        stored = f.tx.effects.cell_stores.get(id(cell.cell))
        if stored is not None:
            f.push(stored[1])   # assigned earlier in this trace
            return
        try:
            contents = cell.cell.cell_contents
        except ValueError:
            raise Unsupported(f"free variable {ins.argval!r} read before assignment") from None
        source = cell.source
        if source is None and f.globals.get("__name__", "").split(".")[0] not in TRUSTED_MODULE_PREFIXES:
            # A user function reached without a source (e.g. a method found on its class): its
            # cells still hold pre-existing objects, which must be guarded and never mutated silently.
            source = AttrSource(ObjectSource(cell.cell, f"closure cell {ins.argval!r} of {f.code.co_qualname}"),
                                "cell_contents")
        f.push(wrap(f.tx, contents, source))


@handler("STORE_DEREF")
def store_deref(f, ins):
    cell = f.cells[ins.argval]
    v = f.pop()
    if isinstance(cell, CellValue):
        cell.contents = v
    elif cell.source is None:
        raise Unsupported(f"assigning nonlocal {ins.argval!r} of a function that cannot be re-read on "
                          "later calls is not supported")
    else:
        # A real cell of a function that exists outside the trace: set after the graph.
        f.tx.effects.store_cell(cell, v)


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
    """``del obj.name`` (trace/python/attrs.py ``del_attr``)."""
    attrs.del_attr(f, f.pop(), ins.argval)


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
    v = f.pop()
    if isinstance(v, ConstantValue) and v._pending_guard is not None and isinstance(v.source, AttrSource):
        # An attribute read for its side effect (`obj.attr` alone, in a `try` catching
        # AttributeError): its value needs no guard, but that it is there does.
        f.tx.guards.add(HAS_ATTR, v.source.base, v.source.attr)


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
    f.push(ConstantValue(operators.identical(f, a, b) != bool(ins.arg)))


@handler("CONTAINS_OP")
def contains_op(f, ins):
    container = f.pop()
    item = f.pop()
    if generators.is_iterated_for_contains(container):
        found = generators.contains_by_iteration(f, container, item)
    else:
        found = operators.contains(f, container, item)
    f.push(ConstantValue(found != bool(ins.arg)))


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
    f.push(ConstantValue({held_item(x) for x in items}))


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
    if any(isinstance(p, FormattedTextValue) for p in parts):
        pieces = []
        for p in parts:
            pieces += p.parts if isinstance(p, FormattedTextValue) else [operators.as_constant(p)]
        f.push(operators.lazy_text(f, pieces))
        return
    f.push(operators.constant_fold(f, lambda *xs: "".join(xs), parts, "string building"))


@handler("FORMAT_VALUE")
def format_value(f, ins):
    flags = ins.arg
    spec = f.pop() if flags & FORMAT_WITH_SPEC else ConstantValue("")
    value = f.pop()
    conv = {0: None, 1: str, 2: repr, 3: ascii}[flags & FORMAT_CONVERSION_MASK]
    if conv is not None:
        value = operators.text_of(f, value, conv)
    f.push(operators.format_of(f, value, spec))


@handler("FORMAT_SIMPLE")
def format_simple(f, ins):
    f.push(operators.format_of(f, f.pop(), ConstantValue("")))


@handler("FORMAT_WITH_SPEC")
def format_with_spec(f, ins):
    spec = f.pop()
    value = f.pop()
    f.push(operators.format_of(f, value, spec))


@handler("CONVERT_VALUE")
def convert_value(f, ins):
    conv = {1: str, 2: repr, 3: ascii}[ins.arg]
    f.push(operators.text_of(f, f.pop(), conv))


@handler("LIST_APPEND")
def list_append(f, ins):
    v = f.pop()
    target = f.stack[-ins.arg]
    _require(f, target, ListValue, "LIST_APPEND").items.append(v)


@handler("SET_ADD")
def set_add(f, ins):
    v = f.pop()
    _new_set(f, f.stack[-ins.arg], "SET_ADD").add(held_item(v))


@handler("MAP_ADD")
def map_add(f, ins):
    v = f.pop()
    k = f.pop()
    _require(f, f.stack[-ins.arg], DictValue, "MAP_ADD").items[operators.key_of(k)] = v


@handler("LIST_EXTEND")
def list_extend(f, ins):
    v = f.pop()
    _require(f, f.stack[-ins.arg], ListValue, "LIST_EXTEND").items.extend(iterate(f, v))


@handler("SET_UPDATE")
def set_update(f, ins):
    v = f.pop()
    _new_set(f, f.stack[-ins.arg], "SET_UPDATE").update(held_item(x) for x in iterate(f, v))


@handler("LIST_TO_TUPLE")
def list_to_tuple(f, ins):
    v = f.pop()
    if not isinstance(v, ListValue):
        raise Unsupported(f"LIST_TO_TUPLE on {attrs.describe(v)} is not supported yet")
    f.push(TupleValue(v.items))


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(f, ins):
    v = f.pop()
    target = _require(f, f.stack[-ins.arg], DictValue, ins.opname)
    items = mapping_items(f, v)
    if ins.opname == "DICT_MERGE":
        dup = set(target.items) & set(items)
        if dup:
            raise Unsupported(f"keyword argument repeated: {sorted(dup)[0]!r}")
    target.items.update(items)


def mapping_items(f, v):
    """{key: value} of a mapping as ``dict.update`` reads it: a dict's items, else ``keys()``
    and ``v[key]`` (a user ``Mapping`` runs its own methods)."""
    part = protocols.dict_part(v)
    if isinstance(part, DictValue) and not protocols.has_special_method(v, "__iter__"):
        # CPython reads a dict (subclass) directly unless it overrides __iter__.
        return dict(part.items)
    if isinstance(v, ConstantValue) and isinstance(v.value, dict):
        return {k: ConstantValue(x) for k, x in v.value.items()}
    try:
        keys_method = attrs.get_attr(f, v, "keys")
    except (Unsupported, exceptions.TracedRaise):
        raise Unsupported(f"** of {attrs.describe(v)} (not a mapping) is not supported yet") from None
    keys = iterate(f, calls.call(f, keys_method, [], {}))
    return {operators.key_of(k): operators.getitem(f, v, k) for k in keys}


def _new_set(f, v, what):
    """The set a set display (or an existing set of constants) is building."""
    if not isinstance(v, ConstantValue) or not isinstance(v.value, set):
        raise Unsupported(f"{what} on {attrs.describe(v)} is not supported yet")
    f.tx.effects.mark_mutated(v, what + " on")
    return v.value


def _require(f, v, cls, what):
    """``v`` as the container ``what`` changes; one read from a source is recorded as mutated."""
    if not isinstance(v, cls):
        raise Unsupported(f"{what} on {attrs.describe(v)} is not supported yet")
    # A container that exists outside the trace (e.g. handed to a resume function):
    # the change is replayed on the real object after the graph.
    return f.tx.effects.mark_mutated(v, what + " on")


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
