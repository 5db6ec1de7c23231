"""Every use of ``torch.compiler.*`` / ``torch._dynamo.*`` in the installed transformers, diffusers,
accelerate and peft, and what each means under torch.compile and under bytegraph.

    python scripts/dropin_audit.py            # print the audit table
    python scripts/dropin_audit.py --write    # and write it into docs/dropin.md (between the markers)

Uses are found in the libraries' code (not comments or docstrings): attribute chains rooted at
``torch`` (or a name bound to ``torch._dynamo`` / ``torch.compiler``), names imported from those
modules, and the marker attribute ``assume_constant_result`` sets, spelled out. ``ROWS`` gives
each API its meaning and the test of it (tests/test_dropin.py); tests/test_dropin.py checks that
every use found in the installed libraries has a row.
"""
import ast
import importlib.util
import os
import sys
from collections import defaultdict

LIBRARIES = ("transformers", "diffusers", "accelerate", "peft")
MARKER = "_dynamo_marked_constant"
ROOTS = ("torch.compiler", "torch._dynamo")

# API -> (what torch.compile does, what bytegraph does, test in tests/test_dropin.py)
ROWS = {
    "torch.compiler.disable": (
        "the function's frame runs eagerly (with `recursive=False`: only its own frame; what it calls "
        "is compiled); a call to it from compiled code is a graph break",
        "same: traced calls break the graph and run it natively; `recursive=False` runs its frame natively "
        "and compiles the functions it calls; `torch.compile(disabled_fn)` compiles the function, as torch",
        "test_disable, test_disable_not_recursive_compiles_what_it_calls, test_disable_on_a_method, "
        "test_compiling_a_disabled_function_compiles_it"),
    "torch.compiler.is_compiling": (
        "True while tracing, False when running",
        "same (True in traced code, so library code takes the compiler's branch)",
        "test_is_compiling, test_transformers_helpers_under_patch"),
    "torch.compiler.is_exporting": (
        "False under torch.compile (True only under torch.export)",
        "same: False",
        "test_is_compiling[is_exporting]"),
    "torch.compiler.allow_in_graph": (
        "calls of the function become one graph node, not traced into",
        "same for user functions (read from torch's registry; torch's own marks on its helpers are left "
        "to bytegraph's handling)",
        "test_allow_in_graph"),
    "torch._dynamo.allow_in_graph": (
        "as torch.compiler.allow_in_graph; on an `nn.Module` class (diffusers' `maybe_allow_in_graph` on its "
        "attention and block classes) nothing changes: instances are traced into",
        "as torch.compiler.allow_in_graph; classes: the same (instances traced into)",
        "test_allow_in_graph, test_allow_in_graph_on_a_module_class"),
    "torch._dynamo.assume_constant_result": (
        "the function runs once at trace time; its result is a constant of the graph (not guarded)",
        "same: called at trace time on constant arguments, folded, not guarded (other arguments: traced)",
        "test_assume_constant_result"),
    MARKER: (
        "transformers' spelling of assume_constant_result (the attribute it sets), under `lru_cache`",
        "same as assume_constant_result (read on the function and on its lru_cache wrapper)",
        "test_assume_constant_result"),
    "torch._dynamo.mark_static_address": (
        "CUDA graphs read the tensor where it is (no copy into the graph's pool); nothing else changes",
        "no effect on what is compiled (as torch without CUDA graphs); under CUDA graphs **not yet**: the "
        "input is copied like any other, with a one-time warning naming it; calling it inside a compiled "
        "function is an error, as in torch",
        "test_torch_marks[mark_static_address], test_static_cache_pattern, "
        "test_marking_inside_a_compiled_function_is_an_error, test_static_address_under_cuda_graphs_warns_once "
        "(GPU)"),
    "torch.compiler.cudagraph_mark_step_begin": (
        "tells CUDA graph trees a new step begins (outside compiled code); ignored inside",
        "same: torch's own function, which bytegraph's CUDA graph trees follow; no graph break inside",
        "test_cudagraph_mark_step_begin"),
    "torch.compiler.reset": (
        "forgets every compiled function (in-memory caches)",
        "patched: forgets bytegraph's compiled functions too (`bytegraph.reset()`), and torch's own",
        "test_reset"),
    "torch._dynamo.config.capture_scalar_outputs": (
        "`.item()` traced as a symbolic scalar instead of breaking the graph",
        "carried to `bytegraph.config.capture_scalar_outputs`: `.item()` is an unbacked SymInt/SymFloat node "
        "in the graph; a Python decision on it breaks the graph",
        "test_capture_scalar_outputs_is_carried_and_captures"),
    "torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint": (
        "Python side effects of a checkpointed function are not repeated when backward recomputes it",
        "no equivalent: they happen again in the recompute, as in eager; a one-time warning names the setting",
        "test_settings_without_equivalent_warn_once"),
    "torch._dynamo.eval_frame.OptimizedModule": (
        "the class of `torch.compile(module)`; libraries test `isinstance` to reach `._orig_mod`",
        "patched: compiled modules are instances of a class derived from bytegraph's OptimizedModule and "
        "torch's, so the test holds and `._orig_mod` is the module; setting `._orig_mod` rewraps. Difference: "
        "the view hands its module tree to the module (no `_orig_mod.` level), so `modules()` of a container "
        "never meets it (accelerate's `has_compiled_regions` is False; unwrapping keeps compiled blocks)",
        "test_compiled_module_is_torch_optimized_module_under_patch, "
        "test_accelerate_unwraps_and_rewraps_a_compiled_model, test_accelerate_compile_regions"),
    "torch._dynamo._trace_wrapped_higher_order_op.TransformGetItemToIndex": (
        "a TorchFunctionMode under which `tensor[scalar_tensor]` is `index`, for masks built with `vmap`",
        "traced: one graph, eager's values",
        "test_transform_getitem_to_index"),
}

# APIs of torch.compile's control surface the libraries do not use, for completeness of the table.
OTHER_ROWS = {
    "torch.compiler.set_stance": (
        "all stances, as function, context manager and decorator (see the stance table above)",
        "same (patched; `bytegraph.set_stance` without the patch)",
        "test_stance_as_context_manager, test_stance_as_function_and_decorator, test_skip_guard_eval_unsafe, "
        "test_force_backend, test_aot_eager_then_compile_warns_once_and_compiles_on_the_second_call"),
    "torch._dynamo.mark_dynamic / maybe_mark_dynamic / mark_unbacked / mark_static": (
        "dims made symbolic (or static) from the first compile",
        "same, read from the tensor's marks with or without the patch (`mark_unbacked`: an ordinary symbolic "
        "size; a `min`/`max` outside which torch raises: bytegraph recompiles)",
        "test_torch_marks, test_mark_dynamic_on_the_first_tensor_only, "
        "test_mark_dynamic_on_a_size_one_dim_specializes"),
    "torch._dynamo.disallow_in_graph": (
        "calls of the function break the graph", "same (read from torch's registry)", "test_disallow_in_graph"),
    "torch.compiler.substitute_in_graph": (
        "the substitute is traced in place of the function", "same for user substitutes",
        "test_substitute_in_graph"),
    "torch._dynamo.graph_break": ("a graph break", "same", "test_graph_break_call"),
    "torch._dynamo.explain": (
        "graphs, breaks and their reasons, ops, guards", "patched: `bytegraph.explain` (same counts)",
        "test_explain"),
    "torch.compiler.save_cache_artifacts / load_cache_artifacts": (
        "the compile caches' artifacts as bytes / written back in another process",
        "bytegraph's persistent-cache entries are artifacts of torch's list too: the same bytes carry them "
        "(with or without the patch)",
        "test_save_and_load_cache_artifacts"),
    "torch._dynamo.config.recompile_limit / cache_size_limit / accumulated_recompile_limit / suppress_errors / "
    "automatic_dynamic_shapes / assume_static_by_default / error_on_recompile / optimize_ddp": (
        "as documented by torch",
        "patched: carried into `bytegraph.config` before each compile",
        "test_config_settings, test_accumulated_recompile_limit, "
        "test_settings_carried_into_bytegraph_config_and_given_back"),
    "torch._dynamo.config.capture_dynamic_output_shape_ops": (
        "as documented by torch",
        "carried to `bytegraph.config.capture_dynamic_output_shape_ops`: `nonzero`, boolean masks, `unique`... "
        "traced with unbacked sizes",
        "test_capture_dynamic_output_shape_ops_is_carried_and_captures"),
    "torch._dynamo.config.force_parameter_static_shapes=False": (
        "as documented by torch", "no equivalent yet: a one-time warning names the setting",
        "test_settings_without_equivalent_warn_once"),
    "torch._dynamo.config.inline_inbuilt_nn_modules": (
        "deprecated, does nothing (always inlined)", "nothing (bytegraph always traces modules)",
        "test_inline_inbuilt_nn_modules_is_a_no_op_in_both"),
    "torch.compiler.nested_compile_region": (
        "the region is traced once as a subgraph and reused", "**pending** (higher-order operators issue): "
        "results are eager's", "test_nested_compile_region_is_pending"),
}


def library_root(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _chain(node):
    """'a.b.c' for an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def uses_in(source):
    """(api, line) for every use in one file's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    aliases = {"torch": "torch"}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.startswith(ROOTS):
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if node.module == "torch" and a.name in ("compiler", "_dynamo"):
                    aliases[a.asname or a.name] = full
                elif node.module.startswith(ROOTS):
                    out.append((full, node.lineno))
    seen = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in seen:
            chain = _chain(node)
            if chain is None:
                continue
            head, _, rest = chain.partition(".")
            if head not in aliases:
                continue
            full = aliases[head] + ("." + rest if rest else "")
            if full.startswith(ROOTS) and full not in ROOTS:
                out.append((full, node.lineno))
                inner = node.value        # count the whole chain once, not its prefixes
                while isinstance(inner, ast.Attribute):
                    seen.add(id(inner))
                    inner = inner.value
        elif isinstance(node, ast.Constant) and node.value == MARKER:
            out.append((MARKER, node.lineno))
    return out


def audit(libraries=LIBRARIES):
    """library -> api -> [file:line, ...]"""
    found = {}
    for lib in libraries:
        root = library_root(lib)
        if root is None:
            continue
        uses = defaultdict(list)
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    source = f.read()
                if "_dynamo" not in source and "compiler" not in source:
                    continue
                for api, line in uses_in(source):
                    uses[api].append(f"{os.path.relpath(path, os.path.dirname(root))}:{line}")
        found[lib] = {api: sorted(where) for api, where in sorted(uses.items())}
    return found


def version(lib):
    try:
        from importlib.metadata import version as v
        return v(lib)
    except Exception:   # noqa: BLE001
        return "?"


def render(found):
    lines = ["| library | API | uses | where (first three) | torch.compile | bytegraph | test |",
             "|---|---|---|---|---|---|---|"]
    for lib, uses in found.items():
        for api, where in uses.items():
            meaning, ours, test = ROWS.get(api, ("?", "?", "?"))
            shown = ", ".join(where[:3]) + (", ..." if len(where) > 3 else "")
            lines.append(f"| {lib} {version(lib)} | `{api}` | {len(where)} | {shown} | {meaning} | {ours} | {test} |")
    counts = ", ".join(f"{lib}: {len(uses)} rows ({sum(len(w) for w in uses.values())} uses)"
                       for lib, uses in found.items())
    lines += ["", f"Rows per library: {counts}.", "",
              "Other control calls of torch.compile (none of the four libraries uses them):", "",
              "| API | torch.compile | bytegraph | test |", "|---|---|---|---|"]
    lines += [f"| `{api}` | {a} | {b} | {t} |" for api, (a, b, t) in OTHER_ROWS.items()]
    return "\n".join(lines)


BEGIN, END = "<!-- audit: begin (scripts/dropin_audit.py --write) -->", "<!-- audit: end -->"


def main(argv):
    table = render(audit())
    print(table)
    if "--write" in argv:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "dropin.md")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:start] + "\n" + table + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
