"""Corpus: containers and their methods, collections, builtins over iterables, itertools, functools.

Each case is code users write, run eagerly and compiled as one graph
(``fullgraph=True``) via ``helpers.check``.
"""
import collections
import copy
import functools
import itertools
import operator

import pytest
import torch

from helpers import check


def t(*shape):
    return torch.randn(*shape)


X = t(3, 4)
LAYER = torch.nn.Linear(4, 2)

# ------------------------------------------------------------------ list methods


def list_append_extend(x):
    out = [x]
    out.append(x + 1)
    out.extend([x * 2, x * 3])
    out.insert(1, x - 1)
    return out


def list_pop_remove(x):
    xs = [1, 2, 3, 4, 2]
    xs.remove(2)
    last = xs.pop()
    first = xs.pop(0)
    return x * last + first, xs


def list_index_count(x):
    xs = [3, 1, 4, 1, 5]
    return x * xs.index(4) + xs.count(1)


def list_sort_reverse(x):
    xs = [3, 1, 2]
    xs.sort()
    ys = [5, 9, 7]
    ys.reverse()
    zs = ["b", "aaa", "cc"]
    zs.sort(key=len, reverse=True)
    return x * xs[0] + ys[0], xs, ys, zs


def list_slicing_assign(x):
    xs = [x, x + 1, x + 2, x + 3]
    xs[1:3] = [x * 10]
    del xs[0]
    return xs


def list_copy_clear(x):
    a = [1, 2]
    b = a.copy()
    b.append(3)
    c = list(a)
    a.clear()
    return x + len(b) + len(c), a, b


def list_mul_concat(x):
    xs = [0] * 3 + [1, 2]
    return [x + i for i in xs]


def list_negative_index_and_in(x):
    xs = [x, x * 2, x * 3]
    return xs[-1] + xs[-2], 2 in [1, 2, 3], "z" not in ["a"]


def list_equality(x):
    return x * ([1, 2] == [1, 2]) + ([1] < [2]), [1, 2] != [1, 3]


def list_del_item_and_iadd(x):
    xs = [1, 2, 3]
    del xs[1]
    xs += [7]
    xs *= 2
    return x * sum(xs)


# ------------------------------------------------------------------ dict methods


def dict_basic(x):
    d = {"a": x, "b": x + 1}
    d["c"] = x * 2
    d.update(e=x * 3)
    d.update({"f": 1.0})
    return d, len(d), "a" in d, list(d)


def dict_get_pop_setdefault(x):
    d = {"a": 1}
    v = d.get("a") + d.get("zz", 10)
    d.setdefault("b", 5)
    d.setdefault("a", 100)
    p = d.pop("a")
    q = d.pop("missing", 0)
    return x * (v + p + q + d["b"]), d


def dict_views_order(x):
    d = {"z": 1, "a": 2, "m": 3}
    d["b"] = 4
    del d["a"]
    keys = list(d.keys())
    values = list(d.values())
    items = list(d.items())
    return x + sum(values), keys, items


def dict_items_loop_with_tensors(x):
    d = {"w": x, "b": x.sum(0)}
    out = {}
    for k, v in d.items():
        out[k + "_sq"] = v * v
    return out


def dict_popitem_copy(x):
    d = {"a": 1, "b": 2}
    e = d.copy()
    k, v = e.popitem()
    return x * v, k, d, e


def dict_merge_ops(x):
    a = {"a": 1, "b": 2}
    b = {"b": 3, "c": 4}
    c = a | b
    a |= {"d": 5}
    return x * c["b"], c, a


def dict_fromkeys_and_comparison(x):
    d = dict.fromkeys(["a", "b"], 0)
    return x + len(d), d, d == {"a": 0, "b": 0}


def dict_from_zip_and_kwargs(x):
    d = dict(zip(["a", "b"], [x, x + 1]))
    e = dict(d, c=x * 2)
    return e


def dict_int_keys_and_clear(x):
    d = {0: x, 1: x + 1}
    total = d[0] + d[1]
    d.clear()
    return total, d


def dict_view_set_ops(x):
    a = {"a": 1, "b": 2}
    b = {"b": 0, "c": 0}
    return x + 1, sorted(a.keys() & b.keys()), sorted(a.keys() | b.keys())


# ------------------------------------------------------------------ sets and tuples


def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    u = s | {9}
    i = s & {2, 3, 100}
    dd = s - {2}
    return x * len(u) + len(i), sorted(dd), 3 in s


def set_from_list_dedupe(x):
    s = set([1, 1, 2, 3, 3])
    s.update([5])
    s.remove(2)
    return x * len(s), sorted(s), frozenset({1}) <= frozenset({1, 2})


def tuple_methods(x):
    tpl = (1, 2, 2, 3)
    return x * tpl.count(2) + tpl.index(3), tpl[1:], tpl + (4,), tpl * 2


def tuple_unpack_star(x):
    a, *rest = (x, x + 1, x + 2)
    *init, last = [1, 2, 3]
    return a + sum(rest), init, last


def tuple_comparison(x):
    return x * ((1, 2) < (1, 3)), (1, 2) == (1, 2), max((1, "a"), (2, "b"))


# ------------------------------------------------------------------ collections


def ordered_dict(x):
    d = collections.OrderedDict()
    d["b"] = x
    d["a"] = x + 1
    d.move_to_end("b")
    return list(d.keys()), d["a"] + d["b"]


def default_dict_list(x):
    d = collections.defaultdict(list)
    for i, k in enumerate(["a", "b", "a"]):
        d[k].append(x * i)
    return d["a"][1] + d["b"][0], len(d["a"]), sorted(d)


def default_dict_int(x):
    counts = collections.defaultdict(int)
    for w in "abracadabra":
        counts[w] += 1
    return x * counts["a"], dict(counts)


Point = collections.namedtuple("Point", ["x", "y"])
Point3 = collections.namedtuple("Point3", "x y z", defaults=[0])


def namedtuple_make_and_read(x):
    p = Point(x, x + 1)
    q = p._replace(y=x * 2)
    return p.x + q.y, p[0] * 2, q


def namedtuple_defaults_and_asdict(x):
    p = Point3(1, 2)
    return x * p.z + p.x, p._asdict(), p._fields


def namedtuple_unpack(x):
    a, b = Point(x, 2.0)
    return a * b


def deque_basic(x):
    q = collections.deque([1, 2, 3])
    q.append(4)
    q.appendleft(0)
    a = q.popleft()
    b = q.pop()
    return x * (a + b), list(q)


def deque_maxlen(x):
    q = collections.deque(maxlen=2)
    for i in range(5):
        q.append(x * i)
    return list(q)


def counter_basic(x):
    c = collections.Counter("hello world")
    return x * c["l"], c.most_common(2), c["zz"]


def counter_of_list(x):
    c = collections.Counter([1, 2, 2, 3, 3, 3])
    return x * sum(c.values()), sorted(c.items())


# ------------------------------------------------------------------ builtins over iterables


def sorted_key_reverse(x):
    names = ["bb", "a", "ccc"]
    return x + 1, sorted(names, key=len), sorted(names, reverse=True), sorted([3, 1, 2], key=lambda v: -v)


def sorted_tensors_by_key(x):
    ts = [x * 3, x, x * 2]
    scales = [3, 1, 2]
    order = sorted(range(3), key=lambda i: scales[i])
    return [ts[i] for i in order]


def sorted_dict_items_by_value(x):
    d = {"a": 3, "b": 1, "c": 2}
    return x + 1, sorted(d.items(), key=lambda kv: kv[1]), sorted(d, key=d.get)


def sorted_named_tensors(x):
    state = {"b.weight": x * 2, "a.weight": x, "c": x.sum()}
    ordered = sorted(state.items())
    return [name for name, _ in ordered], [t for _, t in sorted(state.items(), reverse=True)]


def max_of_pairs_by_first(x):
    pairs = [(1, x), (3, x * 3), (2, x * 2)]
    return max(pairs, key=lambda p: p[0])[1], min(pairs)[1]


def reversed_list_and_range(x):
    out = x
    for i in reversed(range(3)):
        out = out * 2 + i
    return out, list(reversed([x, x + 1]))


def min_max_variants(x):
    xs = [3, 1, 2]
    return (x * min(xs) + max(xs), min(1, 5, 3), max(xs, key=lambda v: -v),
            max([], default=7), min("abc"), max({"a": 1, "b": 2}))


def sum_variants(x):
    return x * sum([1, 2, 3]) + sum((0.5, 0.5), 1.0), sum([x, x, x]), sum([[1], [2]], [])


def any_all_python(x):
    xs = [0, 1, 2]
    return x * any(xs) + all(xs), any([]), all([]), all(v >= 0 for v in xs)


def map_filter(x):
    xs = list(map(lambda v: v * 2, [1, 2, 3]))
    ys = list(filter(lambda v: v % 2, range(6)))
    zs = list(filter(None, [0, 1, "", "a"]))
    return x * sum(xs) + sum(ys), zs, list(map(operator.add, [1, 2], [10, 20]))


def map_over_tensors(x):
    return list(map(torch.relu, [x, -x]))


def zip_variants(x):
    pairs = list(zip([1, 2, 3], "ab"))
    return x + 1, pairs, list(zip([1, 2], [3, 4], strict=True)), list(zip())


def iterators_consumed_like_python(x):
    it = iter([0, 0, 3, 4, 5])
    found = any(it)
    after_any = list(it)
    a, b = iter([1, 2, 3]), iter([10])
    pairs = list(zip(a, b))
    return x * found, after_any, pairs, list(a), list(b), all(v for v in [x.dim() == 2, 0, x])


def zip_unzip(x):
    a, b = zip(*[(1, x), (2, x + 1)])
    return a, b


def enumerate_start(x):
    out = []
    for i, v in enumerate([x, x + 1], start=1):
        out.append(v * i)
    return out, list(enumerate("ab", 5))


def len_and_range_args(x):
    r = range(10, 0, -3)
    return x * len(r), list(r), r[1], 4 in r, range(5)[::2]


# ------------------------------------------------------------------ itertools


def itertools_chain(x):
    return x + 1, list(itertools.chain([1, 2], (3,), "ab")), list(itertools.chain.from_iterable([[1], [2, 3]]))


def itertools_product(x):
    out = []
    for i, j in itertools.product(range(2), range(3)):
        out.append(x * i + j)
    return out, list(itertools.product("ab", repeat=2))


def itertools_islice_repeat(x):
    return x + 1, list(itertools.islice(range(10), 2, 8, 2)), list(itertools.repeat(x, 3))


def itertools_accumulate(x):
    return x + 1, list(itertools.accumulate([1, 2, 3, 4])), list(itertools.accumulate([1, 2, 3], operator.mul))


def itertools_accumulate_tensors(x):
    return list(itertools.accumulate([x, x * 2, x * 3]))


def itertools_zip_longest_pairwise(x):
    return (x + 1, list(itertools.zip_longest([1, 2, 3], "ab", fillvalue="-")),
            list(itertools.pairwise([1, 2, 3, 4])))


def itertools_pairwise_tensors(x):
    xs = [x, x + 1, x * 2]
    return [b - a for a, b in itertools.pairwise(xs)]


def itertools_combinations_permutations(x):
    return (x * len(list(itertools.combinations(range(4), 2))),
            list(itertools.permutations([1, 2, 3], 2)), list(itertools.count(5))[:0] if False else 0)


# ------------------------------------------------------------------ functools and operator


def partial_of_torch_function(x):
    f = functools.partial(torch.sum, dim=0)
    g = functools.partial(torch.add, alpha=2)
    return f(x), g(x, x)


def _scale(v, factor, shift=0.0):
    return v * factor + shift


PARTIAL_GLOBAL = functools.partial(_scale, factor=3.0)


def partial_of_user_function(x):
    f = functools.partial(_scale, factor=2.0)
    return f(x), f(x, shift=1.0), PARTIAL_GLOBAL(x)


def partial_of_lambda_and_nested(x):
    f = functools.partial(lambda a, b, c: a * b + c, x)
    g = functools.partial(f, 2.0)
    return g(1.0), g(c=3.0)


def reduce_python_and_tensors(x):
    total = functools.reduce(operator.add, [1, 2, 3], 10)
    prod = functools.reduce(lambda a, b: a * b, [x, x + 1, x + 2])
    return prod + total


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper


@_logged
def _double(v):
    """Doubles."""
    return v * 2


def wraps_decorated(x):
    return _double(x), _double.__name__, _double.__doc__


@functools.lru_cache(maxsize=None)
def _cached_factor(n):
    return n * 2 + 1


@functools.cache
def _cached_names(n):
    return tuple(f"layer{i}" for i in range(n))


def lru_cached_function(x):
    return x * _cached_factor(3), _cached_names(2)


def itemgetter_attrgetter(x):
    pairs = [(2, "b"), (1, "a")]
    first = operator.itemgetter(0)
    both = operator.itemgetter(1, 0)
    dims = operator.attrgetter("shape")
    return x * first(pairs[0]), sorted(pairs, key=first), both(pairs[0]), dims(x)


def methodcaller_and_operator_funcs(x):
    up = operator.methodcaller("upper")
    split_once = operator.methodcaller("split", ".", maxsplit=1)
    return operator.mul(x, 2), operator.neg(x), up("ab"), operator.contains([1, 2], 2), split_once("a.b.c")


def pick(x, getter):
    return x * getter((2, 3))


def test_preexisting_itemgetter_is_guarded():
    from helpers import compile_counted
    compiled, cnt = compile_counted(pick, fullgraph=True)
    for getter in [operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(0)]:
        assert torch.equal(compiled(X, getter), pick(X, getter))
    assert cnt.frame_count == 3     # each getter object is its own entry (identity guard)


# ------------------------------------------------------------------ more real-world patterns


def setdefault_append(x):
    d = {}
    d.setdefault("k", []).append(x)
    d.setdefault("k", []).append(x + 1)
    return d


def unpack_displays(x):
    a, b = [1, 2], (3,)
    d1, d2 = {"a": x}, {"b": 1}
    return [*a, *b], {**d1, **d2}, (*a, x + 1)


def reversed_shape(x):
    return x.permute(*reversed(range(x.dim()))), tuple(reversed(x.shape)), max(x.shape), sum(x.shape), x.shape[::-1]


def zip_star_matrix(x):
    m = [[1, 2, 3], [4, 5, 6]]
    return x + 1, [list(c) for c in zip(*m)], list(enumerate(zip("ab", [x, x])))


def dict_sorted_rebuild(x):
    d = {"b": x, "a": x + 1}
    return dict(sorted(d.items(), key=lambda kv: kv[0])), {k: d[k] for k in sorted(d)}


def grid(x):
    g = [[0] * 3 for _ in range(2)]
    g[1][2] = 5
    return x * g[1][2], g


def set_union_star(x):
    sets = [{1, 2}, {2, 3}, {4}]
    return x * len(set.union(*sets)), sorted(set().union(*sets)), len(set("hello"))


def any_isinstance(x):
    args = (x, 1, "a")
    return x + any(isinstance(a, torch.Tensor) for a in args), all(isinstance(a, int) for a in args[1:])


def attrgetter_module(x):
    get = operator.attrgetter("weight.shape", "bias")
    shape, bias = get(LAYER)
    return x[:, : shape[0]] + bias


def sum_len_values(x):
    d = {"a": [1, 2], "b": [3]}
    return x * sum(len(v) for v in d.values())


def chain_star(x):
    lists = [[x], [x + 1, x + 2]]
    return list(itertools.chain(*lists))


def copy_copy_list(x):
    a = [x, 1]
    b = copy.copy(a)
    b.append(2)
    return a, b, x + 1


def sorted_set_names(x):
    return x + 1, sorted(set(["b", "a", "b"])), sorted({3: 0, 1: 0})


def enumerate_zip_shapes(x):
    out = []
    for i, (a, b) in enumerate(zip(x.shape, (10, 20))):
        out.append(a * b + i)
    return x * out[0], out


def list_of_tensors_ops(x):
    ts = [x, x * 2, x * 3]
    ts.reverse()
    ts.pop(1)
    ts.insert(0, x - 1)
    return torch.stack(ts), len(ts)


def counter_update_tensor_keys_free(x):
    c = collections.Counter()
    for s in x.shape:
        c[s] += 1
    return x * c[3], dict(c)


def nested_partial_reduce(x):
    add3 = functools.partial(functools.reduce, operator.add)
    return add3([x, x, x])


def minmax_key_tensor_items(x):
    ts = [x[:1], x, x[:2]]
    return max(ts, key=lambda t: t.shape[0]), min(ts, key=len)


def dict_iteration_with_del(x):
    d = {"a": 1, "b": 2, "c": 3}
    for k in list(d):
        if d[k] % 2:
            del d[k]
    return x * len(d), d


def list_comparisons_sorting_tuples(x):
    pairs = [(2, "b"), (1, "z"), (1, "a")]
    pairs.sort()
    return x + 1, pairs, sorted(pairs, key=operator.itemgetter(1), reverse=True)


# ------------------------------------------------------------------ more real-world patterns (2)


def enumerate_reversed_zip(x):
    out = []
    for i, (a, b) in reversed(list(enumerate(zip([x, x * 2], [1, 2])))):
        out.append(a * b + i)
    return out


def dict_get_with_tensor_default(x):
    d = {"a": x}
    return d.get("b", x * 2), d.get("a")


def nested_dict_update(x):
    cfg = {"model": {"dim": 4}, "lr": 0.1}
    cfg["model"]["dim"] *= 2
    cfg.update(lr=0.2)
    return x * cfg["model"]["dim"], cfg


def list_sort_key_len(x):
    words = ["ccc", "a", "bb"]
    words.sort(key=len)
    return x * len(words[0]), words


def ordered_dict_popitem_either_end(x):
    od = collections.OrderedDict(a=1, b=2, c=3)
    first = od.popitem(last=False)
    last = od.popitem()
    return x * first[1] + last[1], list(od)


def class_of_containers(x):
    d = collections.defaultdict(list)
    d["k"].append(1)
    return x + 1, [1].__class__ is list, {}.__class__ is dict, (1,).__class__ is tuple, d.default_factory is list


def ordered_dict_equality_keeps_order(x):
    a, b = collections.OrderedDict(a=1, b=2), collections.OrderedDict(b=2, a=1)
    return x + 1, a == b, a != b, a == dict(b), [a] == [b]


CASES = [
    list_append_extend, list_pop_remove, list_index_count, list_sort_reverse, list_slicing_assign,
    list_copy_clear, list_mul_concat, list_negative_index_and_in, list_equality, list_del_item_and_iadd,
    dict_basic, dict_get_pop_setdefault, dict_views_order, dict_items_loop_with_tensors,
    dict_popitem_copy, dict_merge_ops, dict_fromkeys_and_comparison, dict_from_zip_and_kwargs,
    dict_int_keys_and_clear, dict_view_set_ops,
    set_ops, set_from_list_dedupe, tuple_methods, tuple_unpack_star, tuple_comparison,
    ordered_dict, default_dict_list, default_dict_int, namedtuple_make_and_read,
    namedtuple_defaults_and_asdict, namedtuple_unpack, deque_basic,
    deque_maxlen,
    counter_basic,
    counter_of_list,
    sorted_key_reverse, sorted_tensors_by_key, sorted_dict_items_by_value, sorted_named_tensors,
    max_of_pairs_by_first, reversed_list_and_range,
    min_max_variants, sum_variants, any_all_python, map_filter, map_over_tensors, zip_variants,
    iterators_consumed_like_python, zip_unzip, enumerate_start, len_and_range_args,
    itertools_chain, itertools_product, itertools_islice_repeat, itertools_accumulate,
    itertools_accumulate_tensors, itertools_zip_longest_pairwise, itertools_pairwise_tensors,
    itertools_combinations_permutations,
    partial_of_torch_function, partial_of_user_function, partial_of_lambda_and_nested,
    reduce_python_and_tensors, wraps_decorated, lru_cached_function, itemgetter_attrgetter,
    methodcaller_and_operator_funcs,
    setdefault_append, unpack_displays, reversed_shape, zip_star_matrix, dict_sorted_rebuild, grid, set_union_star, any_isinstance, attrgetter_module, sum_len_values, chain_star, copy_copy_list, sorted_set_names, enumerate_zip_shapes, list_of_tensors_ops, counter_update_tensor_keys_free, nested_partial_reduce, minmax_key_tensor_items, dict_iteration_with_del, list_comparisons_sorting_tuples,
    enumerate_reversed_zip,
    dict_get_with_tensor_default,
    nested_dict_update,
    list_sort_key_len,
    ordered_dict_popitem_either_end,
    class_of_containers,
    ordered_dict_equality_keeps_order,
]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_corpus_containers(fn):
    check(fn, X)


# ------------------------------------------------------------------ returned containers keep their type and are fresh


def returns_defaultdict_and_ordered_dict(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    o = collections.OrderedDict(b=x + 1)
    return d, o


def defaultdict_copy_and_merge(x):
    d = collections.defaultdict(int)
    d["a"] += 1
    e = d.copy()
    e["b"] += 2
    f = d | {"z": 9}
    f["q"] += 1
    return x * e["b"], d, e, f


def returns_partial(x):
    return functools.partial(torch.add, x + 1, alpha=2)


def returns_set_counter_deque(x):
    return x + 1, {1, 2}, collections.Counter("aab"), collections.deque([1, 2], maxlen=3)


@pytest.mark.parametrize("fn", [returns_defaultdict_and_ordered_dict, returns_set_counter_deque,
                                defaultdict_copy_and_merge],
                         ids=lambda f: f.__name__)
def test_returned_container_types(fn):
    _, out = check(fn, X)
    expected = fn(X)
    assert [type(o) for o in out] == [type(o) for o in expected]
    assert [getattr(o, "default_factory", None) for o in out] == \
        [getattr(o, "default_factory", None) for o in expected]


def test_returned_partial_calls_like_eager():
    import bytegraph
    compiled = bytegraph.compile(returns_partial, fullgraph=True)
    y = torch.randn(3, 4)
    p = compiled(X)
    assert isinstance(p, functools.partial)
    assert torch.allclose(p(y), returns_partial(X)(y))


def test_returned_set_is_new_each_call():
    import bytegraph
    compiled = bytegraph.compile(returns_set_counter_deque, fullgraph=True)
    first = compiled(X)
    first[1].add(99)
    first[2]["z"] += 5
    second = compiled(X)
    assert second[1] == {1, 2} and second[2] == collections.Counter("aab")
    assert second[1] is not first[1]


def set_mutated_across_break(x):
    s = {1}
    s.add(2)
    y = x + len(s)
    print(s)
    s.add(3)
    return y * len(s), s


def test_set_mutated_across_graph_break():
    from helpers import check_program
    check_program(set_mutated_across_break, lambda: ((X,), {}, None), graphs=2, calls=3)


def id_escapes(x):
    a = [x]
    return x + 1, id(a), a, {id(a): len(a)}, {id(a)}


def test_id_of_a_value_made_in_the_frame_escapes_as_its_run_time_id():
    import bytegraph
    out = bytegraph.compile(id_escapes, fullgraph=True)(X)
    assert out[1] == id(out[2]) and out[3] == {id(out[2]): 1} and out[4] == {id(out[2])}


class _Owner:
    pass


OWNER = _Owner()
BY_ID = collections.defaultdict(dict)


def keyed_by_id(x, owner):
    state = BY_ID[id(owner)]           # GradScaler keeps per-optimizer state so
    state["seen"] = state.get("seen", 0) + 1
    print("break")
    return x * BY_ID[id(owner)]["seen"]


def test_state_kept_under_the_id_of_an_outside_object():
    # An id stored as a key must be the real one: a placeholder stored in the real dict made
    # the code after the break (and the next call) miss the entry the trace had made.
    import bytegraph
    from bytegraph.testing import CompileCounter
    cnt = CompileCounter()
    compiled = bytegraph.compile(keyed_by_id, backend=cnt)
    BY_ID.clear()
    expected = [keyed_by_id(X, OWNER) for _ in range(3)]
    eager_state = dict(BY_ID)
    BY_ID.clear()
    actual = [compiled(X, OWNER) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, actual))
    assert dict(BY_ID) == eager_state == {id(OWNER): {"seen": 3}}
    other = _Owner()                   # another object: its own entry (a guard on which object)
    assert torch.equal(compiled(X, other), X) and BY_ID[id(other)] == {"seen": 1}


def sort_compares_tensors(x):
    return sorted([(1, x), (1, x + 1)])


def test_sort_that_compares_tensors_is_unsupported():
    import bytegraph
    from bytegraph.errors import Unsupported
    with pytest.raises(Unsupported, match="sorting compared values that are not known"):
        bytegraph.compile(sort_compares_tensors, fullgraph=True)(X)


# ------------------------------------------------------------------ sets and deques of tensors
# Tensors (and plain objects) hash by identity in Python: a set holds the very objects.


def set_of_tensors(x):
    y = x * 2
    s = {x, y, x}
    f = frozenset([x, 1, "a", (x, 2)])
    s.add(y)
    s.discard(x)
    total = x * 0
    for v in s:
        total = total + v
    return len(s), y in s, x in s, x in f, (x, 2) in f, 1 in f, len(f), total, \
        len(s | {x}), len(s & {y}), s == {y}


def set_mixed_values_and_methods(x):
    s = set([1, 2, x])
    s.update([x * 2, 3])
    s.remove(1)
    n = sum(1 for v in s if isinstance(v, torch.Tensor))
    try:
        s.remove(99)
    except KeyError as e:
        missing = e.args
    return n, len(s), 2 in s, missing, sorted(v for v in s if isinstance(v, int))


def set_comprehension_of_tensors(x):
    rows = [x[0], x[1], x[0]]
    unique = {r for r in rows}
    return len(unique), sum(unique)


def deque_of_tensors(x):
    d = collections.deque([x], maxlen=3)
    d.append(x + 1)
    d.appendleft(x * 2)
    d.append(x - 1)                 # drops x * 2 from the left
    d.extend([x * 3])
    first = d.popleft()
    d.rotate(1)
    return first, d[0], d[-1], len(d), list(d), sum(d)


def returns_set_and_deque_of_tensors(x):
    y = x + 1
    return {x, y, 3}, frozenset([y]), collections.deque([y, 4]), y


def test_sets_and_deques_of_tensors():
    for fn in (set_of_tensors, set_mixed_values_and_methods, set_comprehension_of_tensors, deque_of_tensors):
        check(fn, X)


def test_returned_set_and_deque_of_tensors():
    from helpers import compile_counted
    compiled, cnt = compile_counted(returns_set_and_deque_of_tensors, fullgraph=True)
    x = X.clone()
    s, f, d, y = compiled(x)
    assert type(s) is set and type(f) is frozenset and type(d) is collections.deque
    assert x in s and y in s and 3 in s and len(s) == 3 and f == frozenset([y])
    assert list(d)[0] is y and list(d)[1] == 4
    assert torch.allclose(y, X + 1) and cnt.frame_count == 1
    s2 = compiled(x)[0]
    assert s2 is not s and x in s2


def set_argument_gets_a_tensor(x, s):
    s.add(x)
    return x + 1


def test_existing_set_gets_a_tensor():
    x, s = X.clone(), {1, 2}
    compiled = __import__("bytegraph").compile(set_argument_gets_a_tensor, fullgraph=True)
    compiled(x, s)
    assert x in s and len(s) == 3


# ------------------------------------------------------------------ dicts with tensor values


def dict_views_with_tensor_values(x):
    a = {"x": x, "y": 1}
    b = {"y": x * 2, "x": 3}
    c = a | b
    a |= {"z": x * 2}
    keys = (a.keys() == b.keys(), a.keys() - b.keys(), a.keys() & {"x", "q"}, a.keys() | {"q"},
            b.keys() <= a.keys(), sorted(a.keys() ^ {"x", "w"}))
    return c, a, keys


def dict_fromkeys_and_setdefault(x):
    d = dict.fromkeys(["a", "b"], 0)
    e = dict.fromkeys("cd")
    g = dict.fromkeys(range(2), x)
    d["a"] += 1
    dd = collections.defaultdict(list)
    dd.setdefault("a", []).append(x)
    dd["b"].append(x + 1)
    got = dd.setdefault("a", None)
    return x + d["a"], d, e, g, dd["a"][0] + dd["b"][0], sorted(dd), got is dd["a"]


def dict_errors_in_try(x):
    d = {"a": x}
    out = []
    try:
        d.pop("b")
    except KeyError as e:
        out.append(("pop", e.args))
    try:
        del d["zz"]
    except KeyError as e:
        out.append(("del", str(e)))
    try:
        {}.popitem()
    except KeyError as e:
        out.append(("popitem", e.args))
    try:
        [].pop()
    except IndexError as e:
        out.append(("list.pop", str(e)))
    return x + len(out), out, d.pop("b", None)


def test_dicts_with_tensor_values():
    for fn in (dict_views_with_tensor_values, dict_fromkeys_and_setdefault, dict_errors_in_try):
        check(fn, X)


# ------------------------------------------------------------------ namedtuples, itertools


def namedtuple_made_in_frame(x):
    P = collections.namedtuple("P", ["a", "b", "c"], defaults=[5, 6])
    p = P(x)
    q = p._replace(a=x * 2)
    r = P._make([x, 1, 2])
    return p.a + q.a + p.b, p._fields, q._asdict(), P._field_defaults, r.c, tuple(p)[1:], P.__name__


NT = collections.namedtuple("NT", "a b c", defaults=(1, 2))


class NTWithMethods(NT):
    __slots__ = ()

    def total(self):
        return self.a + self.b + self.c

    @property
    def doubled(self):
        return self.a * 2

    @classmethod
    def zeros_like(cls, t):
        return cls(t * 0, 0, 0)


def namedtuple_subclass_methods(x):
    n = NTWithMethods(x)
    z = NTWithMethods.zeros_like(x)
    m = NTWithMethods._make([x, 3, 4])
    return n.total(), n.doubled, z.total(), m.total(), n._asdict(), type(m).__name__, m._replace(b=0).total()


def itertools_groupby_and_combinatorics(x):
    runs = [(k, len(list(g))) for k, g in itertools.groupby([1, 1, 2, 3, 3, 3])]
    by_first = {k: [w for w in g] for k, g in itertools.groupby(["aa", "ab", "b", "ba"], key=lambda s: s[0])}
    groups = list(itertools.groupby("aabbb"))
    stale = [list(g) for _, g in groups]   # a group is over once groupby moves on: all empty but the last
    r = []
    for a, b in itertools.permutations([x, x + 1]):
        r.append(a - b)
    for a, b in itertools.combinations([x, x * 2, x * 3], 2):
        r.append(a * b)
    for a, n in itertools.product([x, -x], [1, 2]):
        r.append(a + n)
    return runs, by_first, stale, r, len(list(itertools.combinations_with_replacement("ab", 2)))


def groupby_of_tensors_by_shape(x):
    rows = [x[0], x[1], x[:2], x[1:3], x[2]]
    return [(k, torch.stack(list(g)).sum()) for k, g in itertools.groupby(rows, key=lambda t: t.shape)]


def reduce_folds(x):
    return functools.reduce(operator.add, [x]), functools.reduce(lambda a, b: a * b, [x], 1), \
        functools.reduce(operator.mul, [2, 3]) * x, functools.reduce(max, [3, 1, 2])


def test_namedtuples_and_itertools():
    for fn in (namedtuple_made_in_frame, namedtuple_subclass_methods, itertools_groupby_and_combinatorics,
               groupby_of_tensors_by_shape, reduce_folds):
        check(fn, X)


def test_reduce_graph_count_matches_torch_compile():
    from helpers import torch_compile_graphs
    cnt, _ = check(reduce_folds, X)
    assert cnt.frame_count == torch_compile_graphs(reduce_folds, (X,)) == 1


# ------------------------------------------------------------------ max/min/sum over tensors, index/in


def max_min_of_one_element_tensors(x):
    a, b, c = x[0, 0], x[1, 1], x[2, 2]
    rows = [x[0].sum(), x[1].sum(), x[2].sum()]
    return max(a, b), min(a, b, c), max(rows), min(rows), max(rows, key=lambda r: -r), \
        max([x[0, :1], x[1, :1]]), sum(rows), sum([x, x], torch.zeros(4))


def test_max_min_sum_over_tensors():
    # Python's choice among one-element tensors is made in the graph (torch.where), and the
    # result is handed back as the chosen tensor itself where it leaves the graph: one graph,
    # where torch.compile breaks at each bool() (3 graphs).
    from helpers import torch_compile_graphs
    check(max_min_of_one_element_tensors, X, graphs=1)
    assert torch_compile_graphs(max_min_of_one_element_tensors, (X,)) == 3


def max_then_update_it_in_place(x):
    a, b = x[0].sum(), x[1].sum()
    m = max(a, b)
    m.add_(100)
    corner = max(x[0, 0], x[1, 1])
    corner.mul_(-1)
    return a, b, x


def test_max_of_tensors_is_one_of_them():
    # An in-place update of max()'s result updates the tensor Python chose: the graph breaks
    # before the update, where the chosen tensor itself is handed back.
    check(max_then_update_it_in_place, X, graphs=2)


def test_max_of_tensors_needing_grad_keeps_pythons_choice():
    # Python returns one of the objects: the other gets no gradient at all (.grad stays None),
    # so with tensors that need grad the comparison runs in Python, at a break.
    from helpers import compile_counted

    def f(a, b):
        return max(a.sum(), b.sum()) * 3
    a1, b1 = X.clone().requires_grad_(), (X * 2).requires_grad_()
    f(a1, b1).backward()
    compiled, cnt = compile_counted(f)
    a2, b2 = X.clone().requires_grad_(), (X * 2).requires_grad_()
    compiled(a2, b2).backward()
    for eager, compiled_grad in ((a1.grad, a2.grad), (b1.grad, b2.grad)):
        assert (eager is None) == (compiled_grad is None)
        assert eager is None or torch.equal(eager, compiled_grad)
    assert cnt.frame_count == 2


def max_needs_bool_of_a_tensor(x, y):
    return max(x, y)      # 4-element rows: eager's bool() raises


def min_of_tensor_and_number(x):
    return min(x.sum(), 0.0)   # the result is the float or the tensor: data decides


def test_max_min_break_where_python_needs_a_tensors_bool():
    from helpers import check_program
    check_program(max_needs_bool_of_a_tensor, lambda: ((X[0].clone(), X[1].clone()), {}, None),
                  graphs=0, fullgraph=False)
    check_program(min_of_tensor_and_number, lambda: ((X.clone(),), {}, None), graphs=1, fullgraph=False)


def index_and_in_with_tensors(x):
    y = x + 1
    items = [x, y, 3]
    return items.index(x), x in items, [x, x].count(x), (y, 1).index(y), items.index(y, 1), [x, y].index(y, 1)


def remove_tensor_by_identity(x):
    y = x * 2
    items = [x, y]
    items.remove(x)
    try:
        [1, 2].index(5)
    except ValueError as e:
        msg = str(e)
    return items, msg


def test_index_count_in_remove_with_tensors():
    check(index_and_in_with_tensors, X)
    check(remove_tensor_by_identity, X)


def index_compares_tensors_by_value(x, y):
    return [x, y].index(y)   # x == y first: bool() of a 12-element tensor raises in eager


def test_index_comparing_tensors_by_value_breaks():
    from helpers import check_program
    check_program(index_compares_tensors_by_value, lambda: ((X.clone(), X.clone() + 1), {}, None),
                  graphs=0, fullgraph=False)


PER_DEVICE = {"found": {torch.device("cpu"): torch.zeros(1)}, (torch.float32, "mode"): 2}


def read_device_keyed(x):
    return x * PER_DEVICE[(torch.float32, "mode")] + sum(t for t in PER_DEVICE["found"].values())


def test_dicts_keyed_by_devices_dtypes_and_tuples_are_read_and_guarded():
    import bytegraph
    compiled = bytegraph.compile(read_device_keyed, fullgraph=True)
    assert torch.equal(compiled(X), read_device_keyed(X))
    PER_DEVICE["found"][torch.device("cpu")] = torch.ones(1)
    assert torch.equal(compiled(X), read_device_keyed(X))
    PER_DEVICE[(torch.float32, "mode")] = 3
    assert torch.equal(compiled(X), read_device_keyed(X))
    del PER_DEVICE["found"][torch.device("cpu")]
    PER_DEVICE["found"][torch.device("cpu", 0)] = torch.full((1,), 2.0)   # another key: traced again
    assert torch.equal(compiled(X), read_device_keyed(X))


REGISTRY = {}
CONFIG = {"a": 1}


def registered_under_container_id(x):
    REGISTRY.setdefault(id(CONFIG), []).append(len(CONFIG))
    return x + len(REGISTRY[id(CONFIG)])


def test_id_of_a_real_container_finds_keys_stored_on_earlier_calls():
    # id() of a dict read from outside was a placeholder: the entry stored on the first call
    # (under the real id) was not found again, and the next call replaced it.
    import bytegraph
    compiled = bytegraph.compile(registered_under_container_id)
    REGISTRY.clear()
    expected = [registered_under_container_id(X) for _ in range(3)]
    eager_registry = {k: list(v) for k, v in REGISTRY.items()}
    REGISTRY.clear()
    actual = [compiled(X) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, actual))
    assert REGISTRY == eager_registry == {id(CONFIG): [1, 1, 1]}


def id_arithmetic(x):
    made = [1]
    try:
        n = (id(made) + 1) % 2 + 1
        text = hex(id(made))[:2]
    except TypeError:
        n, text = -1, "TypeError"
    return x * n if n > 0 else x, text, id(made) == id(made), isinstance(id(made), int), type(id(made)).__name__


def test_arithmetic_on_the_id_of_a_value_made_in_the_frame_breaks():
    # The placeholder's TypeError was raised in the program, and its except clause ran; its
    # type was not int.
    import bytegraph
    from bytegraph.errors import Unsupported
    out = bytegraph.compile(id_arithmetic)(X)
    expected = id_arithmetic(X)
    assert out[1:] == expected[1:] == ("0x", True, True, "int")
    assert torch.equal(out[0], X) or torch.equal(out[0], X * 2)
    with pytest.raises(Unsupported, match="known only at run time"):
        bytegraph.compile(id_arithmetic, fullgraph=True)(X)
