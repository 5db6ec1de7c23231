"""Facts about a code object needed to split it at a graph break.

Plain functions over ``dis`` output: which locals are live at an offset, and
which exception-table entries cover an offset.
"""
import dis
from functools import lru_cache

_READS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"}
_WRITES = {"STORE_FAST"}
_PAIR_READS = {"LOAD_FAST_LOAD_FAST"}
_PAIR_WRITES = {"STORE_FAST_STORE_FAST"}
_TERMINAL = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}
_JUMP_OPCODES = frozenset(dis.hasjrel) | frozenset(dis.hasjabs) | frozenset(getattr(dis, "hasjump", ()))
_UNCONDITIONAL = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"}


@lru_cache(maxsize=1024)
def _raw(code):
    return [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]


def cell_stores(code):
    """name -> (assignments in ``code``, assignments from nested code) for its cell variables."""
    out = {}

    def walk(c, nested):
        for ins in dis.get_instructions(c):
            if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and (ins.argval in code.co_cellvars):
                outer, inner = out.get(ins.argval, (0, 0))
                out[ins.argval] = (outer + (not nested), inner + nested)
        for const in c.co_consts:
            if hasattr(const, "co_code"):
                walk(const, True)

    walk(code, False)
    return out


def exception_entries(code):
    return list(dis.Bytecode(code).exception_entries)


def covering_handlers(code, offset):
    """Exception-table entries whose range contains ``offset``."""
    return [e for e in exception_entries(code) if e.start <= offset < e.end]


def inside_user_handler(code, offset):
    """True if an exception raised at ``offset`` can reach a user ``except``/``finally``
    or the ``__exit__`` of a ``with`` block (which must see it).

    Entries do not nest in the table: the innermost one covers an instruction,
    and its handler code is in turn covered by the next one out. So follow the
    chain of handlers; compiler-made cleanups do not count.
    """
    instrs = _raw(code)
    seen = set()
    todo = [offset]
    while todo:
        at = todo.pop()
        for e in covering_handlers(code, at):
            if e.target in seen:
                continue
            seen.add(e.target)
            head = [i.opname for i in instrs if i.offset >= e.target][:3]
            if head and head[0] == "PUSH_EXC_INFO":
                return True
            todo.append(e.target)
    return False


def _depth_effects(ins):
    """(stack effect falling through, stack effect jumping) of a raw instruction."""
    if ins.opcode >= dis.HAVE_ARGUMENT:
        return (dis.stack_effect(ins.opcode, ins.arg, jump=False),
                dis.stack_effect(ins.opcode, ins.arg, jump=True))
    effect = dis.stack_effect(ins.opcode)
    return effect, effect


@lru_cache(maxsize=1024)
def handler_exits(code, offset, bound):
    """Where an exception raised at ``offset`` can leave the handlers it reaches and go on as
    plain code: (offset of a ``POP_EXCEPT``, offset after it, stack depth there, locals bound
    there on every path) for each one met on the code's paths (normal and exceptional) from the
    handler of the entry covering ``offset`` whose stack is no deeper than at that ``try``'s
    start (a statement's start: only loop iterators and ``with`` exits below); ``bound`` are the
    locals bound at ``offset``. Empty where no entry covers ``offset``, or where the paths
    cannot be followed."""
    instrs = _raw(code)
    by_offset = {ins.offset: k for k, ins in enumerate(instrs)}
    entries = exception_entries(code)

    def entry_at(at):
        return next((e for e in entries if e.start <= at < e.end), None)
    first = entry_at(offset)
    if first is None or first.target not in by_offset:
        return ()
    limit = first.depth
    start = by_offset[first.target]
    depth_at, succs, exits = {}, {}, []
    todo = [(start, first.depth + first.lasti + 1)]
    while todo:
        k, depth = todo.pop()
        if k in depth_at:
            if depth_at[k] != depth:
                return ()
            continue
        if len(depth_at) > 5000:
            return ()
        depth_at[k] = depth
        ins = instrs[k]
        nxt = succs[k] = []
        entry = entry_at(ins.offset)
        if entry is not None:
            if entry.target not in by_offset:
                return ()
            nxt.append((by_offset[entry.target], entry.depth + entry.lasti + 1, True))
        try:
            through, jumping = _depth_effects(ins)
        except ValueError:
            return ()
        if ins.opname == "POP_EXCEPT" and depth + through <= limit and k + 1 < len(instrs):
            exits.append((k, depth + through))
            nxt.clear()      # the code hands over here: nothing after it runs in this frame
        else:
            if ins.opname not in _TERMINAL and ins.opname not in _UNCONDITIONAL and k + 1 < len(instrs):
                nxt.append((k + 1, depth + through, False))
            if ins.opcode in _JUMP_OPCODES:
                if ins.argval not in by_offset:
                    return ()
                nxt.append((by_offset[ins.argval], depth + jumping, False))
        todo.extend((s, d) for s, d, _ in nxt)
    # Locals bound on every path: at the handler, those bound at ``offset``; a store binds, a
    # delete unbinds; an exceptional path keeps only what was bound both before and after.
    every = frozenset(code.co_varnames) | frozenset(bound)
    # An inlined comprehension (3.12+) saves its variable with LOAD_FAST_AND_CLEAR and stores
    # it back, unbound where it was: such a store binds nothing for certain.
    restored = {i.argval for i in instrs if i.opname == "LOAD_FAST_AND_CLEAR"}
    bound_in = {k: every for k in depth_at}
    bound_in[start] = frozenset(bound)
    changed = True
    while changed:
        changed = False
        for k in depth_at:
            ins = instrs[k]
            before = bound_in[k]
            after = before
            if ins.opname in _WRITES:
                after = before | ({ins.argval} - restored)
            elif ins.opname in _PAIR_WRITES:
                after = before | (set(ins.argval) - restored)
            elif ins.opname == "STORE_FAST_LOAD_FAST":
                after = before | ({ins.argval[0]} - restored)
            elif ins.opname == "DELETE_FAST":
                after = before - {ins.argval}
            for succ, _, exceptional in succs[k]:
                new = bound_in[succ] & ((before & after) if exceptional else after)
                if new != bound_in[succ]:
                    bound_in[succ] = new
                    changed = True
    return tuple((instrs[k].offset, instrs[k + 1].offset, depth, bound_in[k]) for k, depth in exits)


@lru_cache(maxsize=1024)
def _liveness(code, saves_read=True):
    instrs = _raw(code)
    by_offset = {ins.offset: k for k, ins in enumerate(instrs)}
    # Jumps may target the EXTENDED_ARG prefix of an instruction: map it to the instruction.
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG" and ins.offset not in by_offset:
            nxt = next((k for k, r in enumerate(instrs) if r.offset > ins.offset), None)
            if nxt is not None:
                by_offset[ins.offset] = nxt
    entries = exception_entries(code)
    n = len(instrs)
    succs = []
    for k, ins in enumerate(instrs):
        s = []
        name = ins.opname
        if name not in _TERMINAL and name not in _UNCONDITIONAL and k + 1 < n:
            s.append(k + 1)
        if ins.opcode in _JUMP_OPCODES:
            target = ins.argval
            if target in by_offset:
                s.append(by_offset[target])
        for e in entries:
            if e.start <= ins.offset < e.end and e.target in by_offset:
                s.append(by_offset[e.target])
        succs.append(s)
    uses, defs = [], []
    # A zero-argument super() reads the frame's first argument (and the __class__ cell) itself.
    implicit_self = {code.co_varnames[0]} if zero_argument_super(code) else set()
    for ins in instrs:
        name = ins.opname
        if implicit_self and name == "LOAD_GLOBAL" and ins.argval == "super":
            uses.append(set(implicit_self)); defs.append(set())
        elif name == "LOAD_FAST_AND_CLEAR" and not saves_read:
            uses.append(set()); defs.append(set())
        elif name in _READS:
            uses.append({ins.argval}); defs.append(set())
        elif name in _WRITES:
            uses.append(set()); defs.append({ins.argval})
        elif name in _PAIR_READS:
            uses.append(set(ins.argval)); defs.append(set())
        elif name in _PAIR_WRITES:
            uses.append(set()); defs.append(set(ins.argval))
        elif name == "STORE_FAST_LOAD_FAST":
            store, load = ins.argval
            uses.append({load} - {store}); defs.append({store})
        else:
            uses.append(set()); defs.append(set())
    live_in = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for k in range(n - 1, -1, -1):
            out = set()
            for s in succs[k]:
                out |= live_in[s]
            new = uses[k] | (out - defs[k])
            if new != live_in[k]:
                live_in[k] = new
                changed = True
    return {ins.offset: frozenset(live_in[k]) for k, ins in enumerate(instrs)}


def zero_argument_super(code):
    """Can ``code`` call ``super()`` without arguments (a method with the ``__class__`` cell)?
    Such a call reads the running frame's first local and ``__class__``: code copied from the
    middle of it passes them explicitly (``bytecode.resume``)."""
    return "__class__" in code.co_freevars and code.co_argcount > 0 and "super" in code.co_names


def live_locals(code, offset, saves_read=True):
    """Names of fast locals that may be read at or after ``offset`` before being written. With
    ``saves_read`` False, an inlined comprehension's save of its variable (3.12+
    ``LOAD_FAST_AND_CLEAR``, which takes an unbound local as it is) is not a read."""
    return _liveness(code, saves_read).get(offset, frozenset(code.co_varnames))


_FRAME_READERS = {"locals", "eval", "exec"}            # read the calling frame whatever the arguments
_FRAME_READERS_WITHOUT_ARGS = {"vars", "dir"}          # vars()/dir() read it; vars(obj)/dir(obj) do not
_FRAME_GETTERS = {"_getframe", "currentframe"}         # sys._getframe(), inspect.currentframe()


@lru_cache(maxsize=1024)
def reads_own_frame(code):
    """(line, what) of the first place ``code`` may read its own frame's locals (``locals()``,
    ``vars()``, ``eval``/``exec``, ``sys._getframe``), else None. Code copied from the middle
    of such a function has other locals than the original (only live ones, plus its own
    parameters), so it must not be split at a graph break."""
    instrs = _raw(code)
    line = code.co_firstlineno
    for k, ins in enumerate(instrs):
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        name = ins.argval
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            if name in _FRAME_READERS:
                return line, f"{name}()"
            if name in _FRAME_READERS_WITHOUT_ARGS:
                call = next((i for i in instrs[k + 1:] if i.opname not in ("PUSH_NULL", "PRECALL")), None)
                if call is not None and call.opname == "CALL" and call.arg == 0:
                    return line, f"{name}()"
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in _FRAME_GETTERS:
            return line, name
    return None
