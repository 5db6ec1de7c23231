"""Sources: where a traced value came from, as an expression over the frame.

A source renders two ways: ``expr()`` is fast Python used in generated guard
and transformed code (module children read through ``_modules[...]`` etc.),
``name()`` is what the user wrote (``self.layers[0].weight``) and appears in
messages.
"""
import math
from dataclasses import dataclass

from ..datamodel import class_attr, raw_attr


def _source(cls):
    """A frozen dataclass whose hash is computed once: sources nest (``self.h[3].attn.weight``
    is five deep) and are hashed on every memo and guard lookup, which made hashing them a
    tenth of a deep model's trace."""
    cls = dataclass(frozen=True, eq=True, repr=False)(cls)
    field_hash = cls.__hash__

    def __hash__(self):
        h = self._hash      # (the class's None until computed: no exception on a first hash)
        if h is None:
            h = field_hash(self)
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        # The hash of a string differs between processes: never carry the cached one.
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    cls._hash = None
    return cls


class Source:
    __slots__ = ()

    def expr(self):
        """Python expression reading this value in generated code."""
        return self.expr_over(Source.expr)

    def expr_over(self, render):
        """Like expr(), with ``render(base)`` producing the base's expression."""
        raise NotImplementedError

    @property
    def base_source(self):
        return None

    def name(self):
        raise NotImplementedError

    @property
    def root(self):
        return self

    def __repr__(self):
        return self.name()


@_source
class LocalSource(Source):
    """An argument (or local) of the compiled frame."""
    local: str

    def expr_over(self, render):
        return self.local

    def name(self):
        return self.local


@_source
class GlobalSource(Source):
    """A name in the compiled function's globals (builtins are handled apart)."""
    global_name: str

    def expr_over(self, render):
        return f"G[{self.global_name!r}]"

    def name(self):
        return f"global {self.global_name}"


@_source
class BuiltinSource(Source):
    """A builtin name that is not shadowed by a global."""
    builtin_name: str

    def expr_over(self, render):
        return f"B[{self.builtin_name!r}]"

    def name(self):
        return f"builtin {self.builtin_name}"


@_source
class ClosureSource(Source):
    """The contents of a free variable's cell of the compiled function."""
    index: int
    var: str

    def expr_over(self, render):
        return f"__closure[{self.index}].cell_contents"

    def name(self):
        return f"closure variable {self.var}"


@_source
class AttrSource(Source):
    base: Source
    attr: str

    def expr_over(self, render):
        return f"{render(self.base)}.{self.attr}"

    def name(self):
        return f"{_plain(self.base)}.{self.attr}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class ModuleEntrySource(Source):
    """An entry of an nn.Module's ``_parameters``/``_buffers``/``_modules`` dict."""
    base: Source
    table: str   # "_parameters", "_buffers" or "_modules"
    key: str

    def expr_over(self, render):
        return f"{render(self.base)}.{self.table}[{self.key!r}]"

    def name(self):
        if self.key.isdigit():
            return f"{_plain(self.base)}[{self.key}]"
        return f"{_plain(self.base)}.{self.key}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class ItemSource(Source):
    """``base[index]`` for tuples, lists and dicts (index is a constant)."""
    base: Source
    index: object

    def expr_over(self, render):
        return f"{render(self.base)}[{_key_expr(self.index, render)}]"

    def name(self):
        return f"{_plain(self.base)}[{self.index!r}]"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class ObjectKeySource(Source):
    """``base[key]`` for a dict keyed by an object compared by identity (a tensor, a module):
    ``key`` is that object's own source."""
    base: Source
    key: Source

    def expr_over(self, render):
        return f"{render(self.base)}[{render(self.key)}]"

    def name(self):
        return f"{_plain(self.base)}[{_plain(self.key)}]"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class DefaultSource(Source):
    """A default argument value of a function reached through a source."""
    base: Source
    index: object   # position in __defaults__ or keyword name in __kwdefaults__
    kw: bool = False

    def expr_over(self, render):
        table = "__kwdefaults__" if self.kw else "__defaults__"
        return f"{render(self.base)}.{table}[{self.index!r}]"

    def name(self):
        return f"default argument of {_plain(self.base)}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class RawAttrSource(Source):
    """``object.__getattribute__(base, attr)``: an attribute read past the class's own
    ``__getattribute__`` (what ``super().__getattribute__(attr)`` in that method reads)."""
    base: Source
    attr: str

    def expr_over(self, render):
        return f"{render(_OBJECT_GETATTRIBUTE)}({render(self.base)}, {self.attr!r})"

    def name(self):
        return f"{_plain(self.base)}.{self.attr}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class ClassEntrySource(Source):
    """What a class's MRO holds for ``attr`` before any ``__get__`` runs, or
    ``datamodel.MISSING`` (``datamodel.class_attr``): what a lookup found on a class."""
    base: Source
    attr: str

    def expr_over(self, render):
        return f"{render(_CLASS_ATTR)}({render(self.base)}, {self.attr!r})"

    def name(self):
        return f"{_plain(self.base)}.__dict__[{self.attr!r}]"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class RawAttrOrMissingSource(Source):
    """``object.__getattribute__(base, attr)``, or ``datamodel.MISSING`` where that raises
    AttributeError (``datamodel.raw_attr``): an unset ``__slots__`` member is guarded as MISSING."""
    base: Source
    attr: str

    def expr_over(self, render):
        return f"{render(_RAW_ATTR)}({render(self.base)}, {self.attr!r})"

    def name(self):
        return f"{_plain(self.base)}.{self.attr}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class RawItemSource(Source):
    """``dict.__getitem__(base, key)``: an item of a dict subclass read past its own
    ``__getitem__`` (one that computes, like HF's ``ClassInstantier``)."""
    base: Source
    key: object

    def expr_over(self, render):
        return f"{render(_DICT_GETITEM)}({render(self.base)}, {self.key!r})"

    def name(self):
        return f"{_plain(self.base)}[{self.key!r}]"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class MappingGetSource(Source):
    """``base.get(key)``: an entry of a mapping that may be missing (None then), e.g. an
    environment variable of ``os.environ``."""
    base: Source
    key: object

    def expr_over(self, render):
        return f"{render(self.base)}.get({_key_expr(self.key, render)})"

    def name(self):
        return f"{_plain(self.base)}.get({self.key!r})"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class TensorItemSource(Source):
    """``base.item()``: the Python number a 0-d integer tensor argument holds, read where the
    graph is called (graph.builder: a graph input used where an op takes a Python number)."""
    base: Source

    def expr_over(self, render):
        return f"{render(self.base)}.item()"

    def name(self):
        return f"{_plain(self.base)}.item()"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class WeakRefCallSource(Source):
    """``base()`` for a weak reference: the object it refers to now (None once that is gone)."""
    base: Source

    def expr_over(self, render):
        return f"{render(self.base)}()"

    def name(self):
        return f"{_plain(self.base)}()"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


def iterator_rest(it):
    """The items a tuple or range iterator has left to give (a tuple or a range), without
    taking any: its ``__reduce__`` names the sequence and the index it has reached (a range
    iterator on Python 3.12 on: the range left, and None)."""
    state = it.__reduce__()
    return state[1][0][state[2]:] if len(state) > 2 else state[1][0][:0]


@_source
class IteratorRestSource(Source):
    """The items left in a tuple or range iterator (``iterator_rest``)."""
    base: Source

    def expr_over(self, render):
        return f"{render(_ITERATOR_REST)}({render(self.base)})"

    def name(self):
        return f"the items left in {_plain(self.base)}"

    @property
    def root(self):
        return self.base.root

    @property
    def base_source(self):
        return self.base


@_source
class FunctionModeSource(Source):
    """The TorchFunctionMode at ``index`` of the mode stack around the call (0: the outermost),
    read where the guards and the transformed function run."""
    index: int

    def expr_over(self, render):
        import torch
        return f"{render(ObjectSource(torch._C._get_function_stack_at, 'torch._C._get_function_stack_at'))}({self.index})"

    def name(self):
        return f"torch function mode {self.index}"


def _key_expr(key, render):
    """A dict key in generated code: a literal, or the key object itself held by the code."""
    if type(key) in (str, int, bool, bytes, type(None)) or type(key) is float and math.isfinite(key):
        return repr(key)
    # Anything else (an enum member, a dtype, a tuple, inf) is held by the code: its repr is not
    # always Python that makes it.
    return render(ObjectSource(key, repr(key)))


def _plain(source):
    # "global foo" reads badly inside a longer path; the bare name is clearer there.
    if isinstance(source, GlobalSource):
        return source.global_name
    if isinstance(source, BuiltinSource):
        return source.builtin_name
    if isinstance(source, ClosureSource):
        return source.var
    return source.name()


@dataclass(frozen=True, eq=False, repr=False)
class ObjectSource(Source):
    """A fixed object held by the generated code (e.g. another module's globals dict)."""
    obj: object
    label: str

    def expr_over(self, render):
        return f"_obj_{id(self.obj):x}"

    def name(self):
        return self.label

    def __eq__(self, other):
        return isinstance(other, ObjectSource) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


_OBJECT_GETATTRIBUTE = ObjectSource(object.__getattribute__, "object.__getattribute__")
_DICT_GETITEM = ObjectSource(dict.__getitem__, "dict.__getitem__")
_CLASS_ATTR = ObjectSource(class_attr, "class_attr")
_RAW_ATTR = ObjectSource(raw_attr, "raw_attr")
_ITERATOR_REST = ObjectSource(iterator_rest, "iterator_rest")
