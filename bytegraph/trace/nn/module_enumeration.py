"""nn.Module enumeration while tracing: ``parameters()``, ``named_modules()``, ``children()``...

The real module tree is walked while tracing; every dict the walk reads is guarded by its
keys (and None entries by identity), every member is read through its own source.
"""
import types

import torch

from ...errors import Unsupported
from ...guards import builder as g
from ...guards.sources import AttrSource, ModuleEntrySource
from ...values.base import ConstantValue, IteratorValue, TupleValue
from ...values.builder import wrap
from ..python import attrs, operators
from ..core.handlers import BUILTIN_HANDLERS


def _module_walk(frame, mv, remove_duplicate=True):
    """[(prefix, module, source)] like ``named_modules()``, guarding each ``_modules`` dict."""
    if mv.source is None:
        raise Unsupported(f"enumerating the members of {attrs.describe(mv)} that has no source")
    out, seen = [], set()

    def visit(prefix, m, src):
        if remove_duplicate and id(m) in seen:
            return
        seen.add(id(m))
        out.append((prefix, m, src))
        _guard_table(frame, m, src, "_modules")
        for name, sub in m._modules.items():
            if sub is not None:
                visit(prefix + ("." if prefix else "") + name, sub, ModuleEntrySource(src, "_modules", name))

    visit("", mv.obj, mv.source)
    return out


def _guard_table(frame, m, src, table):
    entries = m.__dict__[table]
    frame.tx.guards.add(g.DICT_KEYS, AttrSource(src, table), list(entries))
    for k, v in entries.items():
        if v is None:
            frame.tx.guards.add(g.ID_MATCH, ModuleEntrySource(src, table, k), None)


def _module_members(table, named):
    def h(frame, args, kwargs):
        mv = args[0]
        recurse = operators.as_constant(kwargs.get("recurse", args[1] if len(args) > 1 else ConstantValue(True)))
        if len(args) > 2 or set(kwargs) - {"recurse"}:
            raise Unsupported(f"Module.{'named_' if named else ''}{table[1:]}() with prefix/remove_duplicate")
        modules = _module_walk(frame, mv) if recurse else [("", mv.obj, mv.source)]
        out, seen = [], set()
        for prefix, m, src in modules:
            _guard_table(frame, m, src, table)
            for k, v in m.__dict__[table].items():
                pending = frame.tx.effects.attr_stores.get((id(m), k))
                if pending is not None:
                    v = pending[2]   # a buffer given a new tensor earlier in the trace
                if v is None or v is attrs.DELETED or id(v) in seen:
                    continue
                seen.add(id(v))
                value = v if pending is not None else wrap(frame.tx, v, ModuleEntrySource(src, table, k))
                name = prefix + ("." if prefix else "") + k
                out.append(TupleValue([ConstantValue(name), value]) if named else value)
        return IteratorValue(out, cls=types.GeneratorType)
    return h


def _module_tree(children, named):
    def h(frame, args, kwargs):
        mv = args[0]
        if len(args) > 1 or kwargs:
            raise Unsupported("Module.named_modules() with memo/prefix/remove_duplicate")
        if children:
            if mv.source is None:
                raise Unsupported(f"enumerating the members of {attrs.describe(mv)} that has no source")
            _guard_table(frame, mv.obj, mv.source, "_modules")
            found, seen = [], set()
            for k, sub in mv.obj._modules.items():
                if sub is not None and id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((k, sub, ModuleEntrySource(mv.source, "_modules", k)))
        else:
            found = _module_walk(frame, mv)
        out = []
        for name, m, src in found:
            value = mv if m is mv.obj else wrap(frame.tx, m, src)
            out.append(TupleValue([ConstantValue(name), value]) if named else value)
        return IteratorValue(out, cls=types.GeneratorType)
    return h


BUILTIN_HANDLERS[torch.nn.Module.parameters] = _module_members("_parameters", named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_parameters] = _module_members("_parameters", named=True)
BUILTIN_HANDLERS[torch.nn.Module.buffers] = _module_members("_buffers", named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_buffers] = _module_members("_buffers", named=True)
BUILTIN_HANDLERS[torch.nn.Module.children] = _module_tree(children=True, named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_children] = _module_tree(children=True, named=True)
BUILTIN_HANDLERS[torch.nn.Module.modules] = _module_tree(children=False, named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_modules] = _module_tree(children=False, named=True)
