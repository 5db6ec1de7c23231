"""What the debugging tools do to AOTAutograd inner compilers (installed as the backends'
``inner_compiler_hook`` by the runtime): the debug directory keeps each ATen graph and the
code Inductor generates for it; the minifier watches them after 'aot'."""
from . import debug_dir, minifier


def watch_inner_compiler(compiler, backend_name, role):
    compiler = minifier.wrap_inner(compiler, backend_name)
    dump = debug_dir.current_frame()
    if dump is debug_dir.OFF:
        return compiler

    label = backend_name if role == "graph" else f"{backend_name}_{role}"

    def recorded(gm, example_inputs, *args, **kwargs):
        # The frame's folder, even when this runs later (a backward compiled at backward()).
        dump.backend_output(f"{label}_aten_graph", gm.print_readable(print_output=False))
        out = compiler(gm, example_inputs, *args, **kwargs)
        source = getattr(out, "source_code", None)
        if isinstance(source, str):
            dump.backend_output(f"{label}_output_code", source)
        return out

    recorded.__name__ = getattr(compiler, "__name__", "inner_compiler")
    recorded.__wrapped__ = compiler
    return recorded
