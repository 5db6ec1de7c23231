"""Corpus: list/set/dict comprehensions and generator expressions mixed with tensors.

3.12+ inlines comprehensions into the enclosing code (LOAD_FAST_AND_CLEAR,
SWAP, END_FOR...), so these cases also run on 3.13. Each case is one graph
(``fullgraph=True``) compared with eager via ``helpers.check``.
"""
import pytest
import torch

from helpers import check

X = torch.randn(3, 4)
LAYER = torch.nn.Linear(4, 2)
NAMES = ("q", "k", "v")
SCALES = {"a": 1.0, "b": 2.0}


def listcomp_simple(x):
    return [x * i for i in range(3)]


def listcomp_conditional(x):
    return [x + i for i in range(6) if i % 2 == 0]


def listcomp_ternary(x):
    return [x if i % 2 else -x for i in range(4)]


def listcomp_nested_loops(x):
    return [x * i + j for i in range(2) for j in range(3) if i != j]


def listcomp_nested_comprehension(x):
    return [[x * i * j for j in range(2)] for i in range(3)]


def listcomp_over_dims(x):
    return [x.size(d) * 2 for d in range(x.dim())], [x.sum(d) for d in range(x.dim())], [s for s in x.shape]


def listcomp_over_tensor_rows(x):
    return [row.sum() for row in x]


def listcomp_over_zip(x):
    ws = [x, x * 2]
    bs = [1.0, 2.0]
    return [w + b for w, b in zip(ws, bs)]


def listcomp_over_enumerate(x):
    return [v * i for i, v in enumerate([x, x + 1, x + 2])]


def listcomp_over_dict_items(x):
    return [x * s for _, s in SCALES.items()], [k.upper() for k in SCALES]


def listcomp_over_string(x):
    return [c for c in "abc" if c != "b"], x + 1


def listcomp_walrus(x):
    return [y for i in range(4) if (y := i * 2) > 2], x + 1


def setcomp(x):
    return x + 1, {i % 3 for i in range(10)}, {len(n) for n in NAMES}


def dictcomp_simple(x):
    return {n: x * i for i, n in enumerate(NAMES)}


def dictcomp_conditional_and_swap(x):
    d = {"a": 1, "b": 2, "c": 3}
    return x + 1, {v: k for k, v in d.items() if v > 1}


def dictcomp_of_tensor_ops(x):
    ops = {"relu": torch.relu, "tanh": torch.tanh}
    return {name: fn(x) for name, fn in ops.items()}


def genexp_sum(x):
    return sum(x * i for i in range(4))


def genexp_tuple_and_list(x):
    return tuple(x + i for i in range(2)), list(i * i for i in range(3))


def genexp_any_all_python(x):
    vals = [1, -2, 3]
    return x + 1, any(v > 0 for v in vals), all(v > 0 for v in vals), any(v > 10 for v in vals)


def genexp_any_over_shapes(x):
    ts = [x, x.t()]
    if any(t.shape[0] == 4 for t in ts):
        return x + 1
    return x - 1


def genexp_min_max(x):
    return x * max(len(n) for n in NAMES) + min(i for i in range(2, 5))


def genexp_join(x):
    return x + 1, ",".join(str(i) for i in range(4)), "-".join(n.upper() for n in NAMES)


def genexp_dict_from_pairs(x):
    return dict((n, x * i) for i, n in enumerate(NAMES))


def genexp_next(x):
    first_big = next(i for i in range(10) if i * i > 10)
    missing = next((i for i in range(3) if i > 5), -1)
    return x * first_big + missing


def genexp_sorted(x):
    return x + 1, sorted((i * 7) % 5 for i in range(5))


def closure_captures_loop_variable(x):
    fns = [lambda v, i=i: v * i for i in range(3)]
    return [f(x) for f in fns]


def closure_late_binding(x):
    fns = [lambda v: v * i for i in range(3)]
    return [f(x) for f in fns]


def comprehension_uses_enclosing_tensor(x):
    y = x * 2
    return [y + i for i in range(2)]


def comprehension_shadows_local(x):
    i = 100
    out = [x * i for i in range(3)]
    return out, i


def comprehension_shadows_argument(x):
    ys = [x for x in range(3)]
    return x + sum(ys)


def comprehension_variable_not_leaking(x):
    n = 5
    vals = [n for n in range(2)]
    return x * n, vals


def comprehension_in_nested_function(x):
    def scaled(v):
        return [v * k for k in (1, 2)]
    return scaled(x)


def comprehension_calls_method_of_local(x):
    acc = []
    [acc.append(x * i) for i in range(3)]
    return acc


def comprehension_over_list_of_tuples(x):
    pairs = [(1, x), (2, x + 1)]
    return [a * b for a, b in pairs]


def comprehension_nested_unpacking(x):
    data = [("a", (1, 2)), ("b", (3, 4))]
    return x + 1, [k + str(p + q) for k, (p, q) in data]


def comprehension_star_unpack(x):
    rows = [(1, 2, 3), (4, 5, 6)]
    return x + 1, [rest for _, *rest in rows]


def comprehension_chunks(x):
    chunks = x.chunk(2, dim=1)
    return torch.cat([c * (i + 1) for i, c in enumerate(chunks)], dim=1)


def comprehension_conditional_on_shape(x):
    ts = [x, x[:1], x[:, :2]]
    return [t.sum() for t in ts if t.shape[0] > 1]


LAYERS = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.ReLU()])


def comprehension_with_module_list(x):
    return [layer(x) for layer in LAYERS]


def comprehension_zip_strict(x):
    return [a * b for a, b in zip([x, x], [1, 2], strict=True)]


def comprehension_dict_of_lists(x):
    groups = {"even": [0, 2], "odd": [1, 3]}
    return {k: [x * i for i in v] for k, v in groups.items()}


def comprehension_filter_none(x):
    maybe = [x, None, x * 2, None]
    return [m for m in maybe if m is not None]


def comprehension_reduce_pattern(x):
    parts = [x[i] for i in range(x.shape[0])]
    return torch.stack([p * 2 for p in parts])


# ------------------------------------------------------------------ more real-world patterns


def nested_lambda_grid(x):
    fs = [[lambda i=i, j=j: i + j for j in range(2)] for i in range(2)]
    return x * sum(f() for row in fs for f in row)


def tuple_key_dictcomp(x):
    d = {(i, j): x * i + j for i in range(2) for j in range(2)}
    return d[(1, 1)], list(d)


def cat_genexp(x):
    ts = x.unbind(0)
    return torch.cat(tuple(t * 2 for t in ts)), torch.stack(list(t for t in x.split(1)))


def params_sum(x):
    n = sum(p.numel() for p in LAYER.parameters())
    return x * n, any(p.requires_grad for p in LAYER.parameters())


def max_default_genexp(x):
    ts = [x, x[:2]]
    return x * max((t.shape[0] for t in ts), default=0) + max((i for i in []), default=1)


def map_star(x):
    return [*map(lambda t: t + 1, [x, x * 2])]


def user_generator(x):
    def gen(n):
        for i in range(n):
            yield x * i
        yield from [x, x]
    return list(gen(2))


def walrus_in_comprehension(x):
    vals = [last := i * 2 for i in range(3)]
    return x * last, vals


def inlined_closure_in_comprehension(x):
    return [(lambda: x * i)() for i in range(3)]


def sorted_by_shape(x):
    ts = [x[:, :3], x[:, :1], x]
    return sorted(ts, key=lambda t: t.shape[-1])


def ternary_genexp(x):
    return sum((x if i % 2 else -x) for i in range(3))


def all_dims_positive(x):
    if all(d > 0 for d in x.shape) and not any(d == 0 for d in x.shape):
        return x + 1
    return x


def zip_dict_keys_values(x):
    d = {"w": x, "b": x.sum(0)}
    return dict(zip(d.values(), d.keys())) if False else {k: v * 2 for k, v in zip(d.keys(), d.values())}


# ------------------------------------------------------------------ closures, cells, generators


def comp_closure_over_comp_var(x):
    fs = [lambda: x * i for i in range(3)]
    return [f() for f in fs]


def nested_comp_closure(x):
    return [[(lambda: i * j)() for j in range(2)] for i in range(2)], x + 1


def comp_in_loop_with_break(x):
    out = x
    for k in range(5):
        vals = [k * i for i in range(3)]
        if sum(vals) > 6:
            break
        out = out + sum(vals)
    return out


def comp_uses_cell_var(x):
    scale = 2
    def f(v):
        return v * scale
    return [f(x) for _ in range(2)], [scale * i for i in range(2)]


def comp_modifies_outer_list(x):
    seen = []
    out = [seen.append(i) or x * i for i in range(3)]
    return out, seen


def comp_same_name_as_cell(x):
    i = 10
    def g():
        return i
    vals = [i for i in range(3)]
    return x * g(), vals


def comp_shadows_captured_argument(x, k=3):
    def g():
        return k
    vals = [k * 2 for k in range(k)]
    return x * g(), vals, [(lambda: k)() for k in range(2)]


def nested_comps_shadow_cell(x):
    j = 5
    get = lambda: j  # noqa: E731
    grid = [[i * j for j in range(2)] for i in range(2)]
    return x * get(), grid, [j for j in [j for j in range(3)]]


def generator_expression_lazy_consumption(x):
    g = (x * i for i in range(3))
    first = next(g)
    rest = list(g)
    return first, rest


def comp_over_range_len(x):
    return [x[i] * i for i in range(len(x))]


def comp_with_tuple_target_and_index(x):
    d = {"a": (1, 2), "b": (3, 4)}
    return [x * a + b for (a, b) in d.values()]


def comp_dict_nested_items(x):
    cfg = {"l1": {"w": 1.0}, "l2": {"w": 2.0}}
    return {k: x * v["w"] for k, v in cfg.items()}


def setcomp_over_shapes(x):
    ts = [x, x.t(), x]
    return x + 1, {t.shape for t in ts}


def comp_async_free_lambda_default(x):
    return [(lambda v, k=k: v + k)(x) for k in range(2)]


def gen_sum_of_squares_tensor(x):
    return sum(t ** 2 for t in x.unbind(1))


def generator_with_return_value(x):
    def gen():
        yield x
        yield x * 2
    a, b = gen()
    return a + b


def gen_send_none(x):
    def gen():
        total = x
        for i in range(3):
            total = total + i
            yield total
    return [t for t in gen()][-1]


CASES = [
    listcomp_simple, listcomp_conditional, listcomp_ternary, listcomp_nested_loops,
    listcomp_nested_comprehension, listcomp_over_dims, listcomp_over_tensor_rows, listcomp_over_zip,
    listcomp_over_enumerate, listcomp_over_dict_items, listcomp_over_string, listcomp_walrus,
    setcomp, dictcomp_simple, dictcomp_conditional_and_swap, dictcomp_of_tensor_ops,
    genexp_sum, genexp_tuple_and_list, genexp_any_all_python, genexp_any_over_shapes,
    genexp_min_max, genexp_join, genexp_dict_from_pairs, genexp_next, genexp_sorted,
    closure_captures_loop_variable, closure_late_binding, comprehension_uses_enclosing_tensor,
    comprehension_shadows_local, comprehension_shadows_argument, comprehension_variable_not_leaking,
    comprehension_in_nested_function, comprehension_calls_method_of_local,
    comprehension_over_list_of_tuples, comprehension_nested_unpacking, comprehension_star_unpack,
    comprehension_chunks, comprehension_conditional_on_shape, comprehension_with_module_list,
    comprehension_zip_strict, comprehension_dict_of_lists, comprehension_filter_none,
    comprehension_reduce_pattern,
    nested_lambda_grid,
    tuple_key_dictcomp,
    cat_genexp,
    params_sum,
    max_default_genexp,
    map_star,
    user_generator,
    walrus_in_comprehension,
    inlined_closure_in_comprehension,
    sorted_by_shape,
    ternary_genexp,
    all_dims_positive,
    zip_dict_keys_values,
    comp_closure_over_comp_var,
    nested_comp_closure,
    comp_in_loop_with_break,
    comp_uses_cell_var,
    comp_modifies_outer_list,
    comp_same_name_as_cell,
    comp_shadows_captured_argument,
    nested_comps_shadow_cell,
    generator_expression_lazy_consumption,
    comp_over_range_len,
    comp_with_tuple_target_and_index,
    comp_dict_nested_items,
    setcomp_over_shapes,
    comp_async_free_lambda_default,
    gen_sum_of_squares_tensor,
    generator_with_return_value,
    gen_send_none,
]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_corpus_comprehensions(fn):
    check(fn, X)


# ------------------------------------------------------------------ over a module's members

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.dec = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU())
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        n = sum(p.numel() for p in self.parameters())
        names = [name for name, _ in self.named_parameters()]
        device = next(self.parameters()).device
        kinds = [type(m).__name__ for m in self.modules()]
        kids = [name for name, _ in self.named_children()]
        bufs = {k: b * 1 for k, b in self.named_buffers()}
        return self.dec(self.enc(x)) * n, names, device, kinds, kids, bufs


def test_module_members_in_comprehensions():
    check(Net(), X)


def test_module_members_recompile_when_tree_changes():
    import bytegraph
    net = Net()
    compiled = bytegraph.compile(net)
    compiled(X)
    net.enc.extra = torch.nn.Parameter(torch.ones(3))
    expected = net(X)
    got = compiled(X)
    assert got[0].allclose(expected[0]) and got[1] == expected[1] and "enc.extra" in got[1]
    net.enc.bias = None
    expected = net(X)
    got = compiled(X)
    assert got[0].allclose(expected[0]) and got[1] == expected[1]
