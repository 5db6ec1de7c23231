"""A cache miss, end to end: trace, build guards, hand the graph to the backend, generate code."""
import dis

from ..config import config
from ..debug import logs, records
from ..errors import BackendError, BytegraphError, Unsupported
from ..guards.builder import compile_guards
from ..codegen.transformed import collect_outputs, generate
from ..testing import count_ops
from ..trace.tracer import frame_params, trace_frame
from .cache import CacheEntry

_counter = [0]
log_graph = logs.get_logger("graph")
log_guards = logs.get_logger("guards")
log_code = logs.get_logger("output_code")
log_bytecode = logs.get_logger("bytecode")
log_breaks = logs.get_logger("graph_breaks")


def compile_frame(fn, frame_args, compiler, cache=None):
    code = fn.__code__
    params = frame_params(code)
    values = frame_args[:len(params)]
    guard_params = params + (["__closure"] if code.co_freevars else [])
    _counter[0] += 1
    n = _counter[0]
    if logs.enabled("bytecode"):
        log_bytecode.debug("ORIGINAL BYTECODE %s %s:%s\n%s", fn.__qualname__, code.co_filename,
                           code.co_firstlineno, dis.Bytecode(code).dis())
    try:
        result = trace_frame(fn, values, compiler, cache=cache)
        entry = _finish(fn, result, guard_params, compiler, n)
    except Unsupported as e:
        if compiler.fullgraph:
            raise
        try:
            entry = _split_at_break(fn, values, compiler, e, guard_params, n, cache)
        except BytegraphError:
            raise
        except Exception as internal:
            if not config.suppress_errors:
                raise
            log_breaks.debug("internal error while splitting %s at a break: %r", fn.__qualname__, internal)
            entry = None
        if entry is None:
            return _fallback(fn, e, guard_params, n)
    except BytegraphError:
        raise
    except Exception as e:
        if not config.suppress_errors:
            raise
        err = Unsupported(f"internal error while tracing: {type(e).__name__}: {e}")
        if compiler.fullgraph:
            raise err from e
        return _fallback(fn, err, guard_params, n)
    return entry


def _finish(fn, result, guard_params, compiler, n):
    tx = result.tx
    outputs = collect_outputs(result.return_value, [])
    gm = tx.graph.output(outputs)
    name = f"transformed_{_clean(fn.__name__)}_{n}"
    uses_graph = count_ops(gm) > 0
    if uses_graph:
        compiled = _compile_graph(compiler, fn)(gm, tx.graph.example_inputs())
    else:
        compiled = gm
    run, source = generate(name, guard_params, tx.graph.inputs, compiled, result.return_value,
                           outputs, fn.__globals__, uses_graph)
    _add_shape_guards(tx)
    guard, explain, guard_source = compile_guards(tx.guards, guard_params, fn.__globals__,
                                                  name=f"guard_{_clean(fn.__name__)}_{n}")
    guards = list(tx.guards)
    if logs.enabled("guards"):
        log_guards.debug("GUARDS %s\n%s", fn.__qualname__, "\n".join(f"  - {g.describe()}" for g in guards))
    if logs.enabled("output_code"):
        log_code.debug("TRANSFORMED CODE %s\n%s", fn.__qualname__, source)
    records.record(records.FrameRecord(fn.__qualname__, fn.__code__.co_filename, fn.__code__.co_firstlineno,
                                       graph=gm if uses_graph else None, guards=guards,
                                       transformed_source=source, guard_source=guard_source))
    return CacheEntry(guard, run, explain, guards, graph=gm if uses_graph else None,
                      transformed_source=source, guard_source=guard_source)


def _add_shape_guards(tx):
    from ..guards.builder import SHAPE_ENV
    if tx.graph.shapes.has_symbols:
        tx.guards.add(SHAPE_ENV, None, tx.graph.shapes)


def _compile_graph(compiler, fn):
    def compile_graph(gm, example_inputs):
        if logs.enabled("graph"):
            log_graph.debug("GRAPH %s\n%s", fn.__qualname__, gm.print_readable(print_output=False))
        try:
            return compiler.compiler_fn(gm, example_inputs)
        except BytegraphError:
            raise
        except Exception as e:
            raise BackendError(f"backend {compiler.backend_name!r} failed on the graph of "
                               f"{fn.__qualname__}: {type(e).__name__}: {e}") from e
    return compile_graph


def _split_at_break(fn, values, compiler, err, guard_params, n, cache=None):
    """Trace again up to the instruction that broke, and resume after it. None: cannot."""
    from ..bytecode.instructions import decode
    from ..codegen.breaks import RESUME_INFO, generate_break, plan_break
    if err.root_index is None:
        return None
    try:
        result = trace_frame(fn, values, compiler, stop_before=err.root_index, cache=cache)
        if not result.frame.stopped:
            return None
        ins = decode(fn.__code__)[err.root_index]
        kind = plan_break(fn, result.frame, ins)
        name = f"transformed_{_clean(fn.__name__)}_{n}"
        run, source, gm = generate_break(fn, result, ins, kind, compiler, guard_params, name,
                                         fn.__code__ in RESUME_INFO, _compile_graph(compiler, fn))
    except Unsupported as e:
        log_breaks.debug("cannot resume %s after its graph break: %s", fn.__qualname__, e.reason)
        return None
    tx = result.tx
    _add_shape_guards(tx)
    guard, explain, guard_source = compile_guards(tx.guards, guard_params, fn.__globals__,
                                                  name=f"guard_{_clean(fn.__name__)}_{n}")
    guards = list(tx.guards)
    log_breaks.debug("graph break in %s: %s\n%s", fn.__qualname__, err.reason,
                     "".join(f"  {s.filename}:{s.lineno} in {s.name}\n" for s in err.user_stack))
    if logs.enabled("guards"):
        log_guards.debug("GUARDS %s\n%s", fn.__qualname__, "\n".join(f"  - {g.describe()}" for g in guards))
    if logs.enabled("output_code"):
        log_code.debug("TRANSFORMED CODE %s\n%s", fn.__qualname__, source)
    records.record(records.FrameRecord(fn.__qualname__, fn.__code__.co_filename, fn.__code__.co_firstlineno,
                                       graph=gm, guards=guards, break_reason=err.reason,
                                       user_stack=list(err.user_stack), transformed_source=source,
                                       guard_source=guard_source))
    return CacheEntry(guard, run, explain, guards, graph=gm, transformed_source=source,
                      guard_source=guard_source)


def _fallback(fn, err, guard_params, n):
    """The frame runs eagerly; guard on what decided that, so other inputs may still compile."""
    from ..guards.builder import GuardSet, add_global_state_guards
    guards = GuardSet()
    add_global_state_guards(guards)
    guard, explain, guard_source = compile_guards(guards, guard_params, fn.__globals__,
                                                  name=f"guard_{_clean(fn.__name__)}_{n}")
    reason = str(err)
    log_breaks.debug("running %s eagerly: %s", fn.__qualname__, reason)
    records.record(records.FrameRecord(fn.__qualname__, fn.__code__.co_filename, fn.__code__.co_firstlineno,
                                       fallback_reason=err.reason, user_stack=list(err.user_stack)))
    call_original = _original_caller(fn, guard_params)
    return CacheEntry(guard, call_original, explain, list(guards), fallback_reason=reason)


def _original_caller(fn, guard_params):
    from .dispatch import _signature_parts
    _, passthrough, original, _ = _signature_parts(fn)
    src = f"def call_original({', '.join(passthrough)}):\n    return __fn({', '.join(original)})\n"
    ns = {"__fn": fn}
    exec(src, ns)
    return ns["call_original"]


def _clean(name):
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
