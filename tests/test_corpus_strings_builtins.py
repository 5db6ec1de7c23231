"""Corpus: strings, formatting, introspection builtins, numbers, math, torch metadata.

Each case is one graph (``fullgraph=True``) compared with eager via
``helpers.check``.
"""
import collections.abc
import math
import numbers
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import check

X = torch.randn(3, 4)
CONFIG = {"name": "enc", "layers": 2}
PREFIX = "layer"
ACT = "relu"


# ------------------------------------------------------------------ formatting


def fstring_specs(x):
    n, f = 7, 3.14159
    return x + 1, f"{n:03d}|{f:.2f}|{f:>8.3f}|{n:x}|{n:b}|{'ab':^6}|{1e-5:e}|{0.25:%}"


def fstring_conversions(x):
    s = "q"
    return x + 1, f"{s!r} {s!s} {s!a} {3.0!r} {None}"


def fstring_with_shapes(x):
    return x + 1, f"shape={tuple(x.shape)} dim={x.dim()} dtype={x.dtype}"


def fstring_nested_spec(x):
    width, prec = 8, 3
    return x + 1, f"{2.5:{width}.{prec}f}"


def percent_formatting(x):
    return x + 1, "%d items, %.1f%%, %s, %r" % (3, 99.5, "ok", "r"), "%(a)s-%(b)d" % {"a": "x", "b": 2}


def str_format_method(x):
    return x + 1, "{} + {} = {:.1f}".format(1, 2, 3.0), "{name}:{0}".format(5, name="n"), format(255, "#x")


def str_and_repr_of_constants(x):
    return x + 1, str(1.5), repr("a'b"), str(None), repr([1, "a"]), str((1,)), str(True), repr(1e100)


def str_of_dtype_and_device(x):
    return x + 1, str(x.dtype), str(x.device), repr(torch.float16)


# ------------------------------------------------------------------ string methods


def string_methods(x):
    s = "  Hello, World  "
    t = s.strip()
    return (x + len(t), t.lower(), t.upper(), t.split(", "), "-".join(["a", "b"]), t.startswith("He"),
            t.endswith("x"), t.replace("l", "L"), s.lstrip(), s.rstrip(), t.title(), t.find("o"), t.count("l"))


def string_predicates(x):
    return x + 1, "abc".isalpha(), "123".isdigit(), "a1".isalnum(), " ".isspace(), "Ab".istitle()


def string_split_variants(x):
    return (x + 1, "a.b.c".rsplit(".", 1), "a b  c".split(), "k=v".partition("="), "l1\nl2".splitlines(),
            "abc".zfill(5), "x".center(5, "*"), "ab".ljust(4, "."))


def string_building_keys(x):
    out = {}
    for i in range(3):
        out[PREFIX + "_" + str(i)] = x * i
    return out


def string_indexing_and_slicing(x):
    s = "transformer"
    return x * len(s[2:5]), s[0], s[-1], s[::-1], "former" in s


def string_comparison_branch(x):
    if CONFIG["name"].startswith("en") and CONFIG["name"] != "dec":
        return x + 1
    return x - 1


def string_multiplication_concat(x):
    return x + 1, "-" * 5 + "|", "ab" + "cd", "a" < "b"


def string_encode_ord_chr(x):
    return x * ord("a"), chr(98), "é".encode("utf-8"), b"ab".decode()


def string_method_on_global_str(x):
    return x + len(PREFIX.upper()), PREFIX.upper()


# ------------------------------------------------------------------ assert, type, id, isinstance


def assert_on_python_values(x):
    n = x.dim()
    assert n == 2, "expected a matrix"
    assert isinstance(n, int)
    assert CONFIG["layers"] > 0
    return x * n


def type_of_values(x):
    return x + 1, type(1), type("s") is str, type(x) is torch.Tensor, type([]) == list, type(None)


def type_dispatch(x):
    def scale(v):
        if type(v) is float:
            return v * 2
        if type(v) is int:
            return v + 1
        return v
    return x * scale(1.5) + scale(1)


def id_not_leaking(x):
    a = [1]
    b = a
    return x + 1 if id(a) == id(b) else x - 1


def id_of_existing_objects(x):
    return x + 1 if id(CONFIG) == id(CONFIG) else x


def id_of_singletons_and_frame_sets(x):
    s = {1}
    t = s
    seen = {id(None)}
    return x + 1, id(None) == id(None), id(s) == id(t), id(s) != id({1}), id(None) in seen


def id_as_dict_key(x):
    a, b = [x], [x + 1]
    table = {id(a): "a", id(b): "b"}
    return table[id(b)], b[0]


def isinstance_tuples(x):
    return x + 1, isinstance(1, (int, float)), isinstance("a", (list, tuple)), isinstance(x, (torch.Tensor, int))


def isinstance_abcs(x):
    return (x + 1, isinstance(CONFIG, collections.abc.Mapping), isinstance([1], collections.abc.Sequence),
            isinstance(3.5, numbers.Number), isinstance(2, numbers.Integral), isinstance("s", collections.abc.Iterable),
            isinstance(x, numbers.Number))


def isinstance_bool_is_int(x):
    return x + 1, isinstance(True, int), issubclass(bool, int), isinstance(x, torch.nn.Parameter)


def callable_checks(x):
    return x + 1, callable(len), callable(torch.relu), callable(3), callable(lambda: 0), callable(str)


def getattr_hasattr(x):
    return (x + 1, getattr(x, "ndim"), getattr(CONFIG, "missing", "dflt"), hasattr(x, "shape"),
            hasattr(x, "nope"), getattr(math, "pi"), hasattr("s", "upper"))


# ------------------------------------------------------------------ numbers


def divmod_round_abs(x):
    q, r = divmod(17, 5)
    return x * q + r, round(2.567, 2), round(2.5), round(3.5), abs(-3), abs(-2.5), divmod(-7, 2)


def int_float_bool_conversions(x):
    return (x + 1, int("12") + int(3.9) + int(True), float("1.5"), float(2), bool(0), bool("a"), bool([]),
            int("ff", 16), float("inf") > 1e308)


def numeric_edge_ops(x):
    return x + 1, 7 // -2, -7 % 3, 2 ** -1, 10 / 4, 1e300 * 10, min(0.0, -0.0), pow(2, 10, 1000)


def math_on_constants(x):
    scale = math.sqrt(16) / math.log(math.e) + math.floor(2.7) + math.ceil(0.1)
    return (x * scale, math.isclose(0.1 + 0.2, 0.3), math.pi, math.inf, math.prod([2, 3]), math.gcd(12, 18),
            math.isfinite(1.0), math.exp(0), math.cos(0), math.hypot(3, 4), math.log2(8), math.factorial(4))


def math_of_tensor_shape(x):
    d = x.shape[-1]
    return x / math.sqrt(d)


def int_of_shape_product(x):
    n = int(math.prod(x.shape))
    return x.reshape(n)


def bool_of_python_containers(x):
    out = x
    if []:
        out = out + 100
    if [0]:
        out = out + 1
    if {}:
        out = out + 1000
    if "":
        out = out - 1
    return out


# ------------------------------------------------------------------ torch metadata


def finfo_iinfo(x):
    fi = torch.finfo(x.dtype)
    ii = torch.iinfo(torch.int8)
    return x.clamp(min=fi.min, max=fi.max) * fi.eps, ii.max, ii.min, torch.finfo(torch.float16).tiny


def finfo_default(x):
    return x + torch.finfo().eps


def is_tensor_is_floating_point(x):
    return x + 1, torch.is_tensor(x), torch.is_tensor(3), torch.is_floating_point(x), torch.is_complex(x)


def dtype_comparisons(x):
    y = x.to(torch.float64) if x.dtype == torch.float32 else x
    return y, x.dtype is torch.float32, x.dtype != torch.int64, x.dtype in (torch.float16, torch.float32)


def dtype_properties(x):
    return (x + 1, x.dtype.is_floating_point, torch.int64.is_floating_point, x.dtype.is_complex,
            x.dtype.itemsize, torch.bool.is_signed)


def device_comparisons(x):
    return (x + 1, x.device == torch.device("cpu"), x.device.type, x.device.type == "cuda", x.is_cuda,
            str(torch.device("cpu", 0)))


def torch_size_methods(x):
    s = x.shape
    return (x + 1, s.numel(), s[0], s[-1], s[1:], s + (5,), s == (3, 4), s == torch.Size([3, 4]), len(s),
            list(s), s.count(3), s.index(4), tuple(s) + s)


def torch_size_new(x):
    s = torch.Size([2, 6])
    return x.reshape(s), s.numel(), isinstance(s, tuple)


def get_default_dtype_and_grad(x):
    return x.to(torch.get_default_dtype()) * torch.is_grad_enabled()


def element_size_and_numel(x):
    return x * x.element_size() + x.numel(), x.nelement(), x.ndim


# ------------------------------------------------------------------ more real-world patterns


def map_str_join(x):
    return x + 1, ", ".join(map(str, x.shape)), "x".join(str(s) for s in x.shape)


def str_format_misc(x):
    name = "enc.layer.0"
    return x + 1, "{:>10}|{:<4}|".format(name[:3], 7), name.split(".")[-1], "{a}-{b}".format_map({"a": 1, "b": 2})


def fstring_size(x):
    return x + 1, f"{x.shape}", "%s" % (x.shape,), str(x.shape), repr(x.dtype)


def int_div_round(x):
    return x[: int(x.shape[0] / 2)], round(x.shape[1] * 0.5), float("nan") != float("nan")


def version_check(x):
    return x * 2 if sys.version_info >= (3, 8) else x


# ------------------------------------------------------------------ more real-world patterns


def fstring_selfdoc(x):
    n = x.size(0)
    return x + 1, f"{n=}", f"{x.shape[0]:>5}", "{:.3e}".format(1234.5), "{0.real}".format(3)


def string_methods_more(x):
    name = "enc.layer.0.weight"
    return (x + 1, name.removeprefix("enc."), name.removesuffix(".weight"), "a,b,c".split(",", maxsplit=1),
            str(x.dtype).split(".")[-1], name.rpartition(".")[0], name.index("layer"), name.casefold())


def type_name_and_class(x):
    return x + 1, type(x).__name__, x.__class__ is torch.Tensor, isinstance(x.shape, tuple), isinstance(x.dtype, torch.dtype)


def tensor_predicates(x):
    return x + 1, x.is_floating_point(), x.is_contiguous(), x.t().is_contiguous(), torch.float32 == torch.float


def shape_arith(x):
    h = math.floor(x.shape[0] / 2)
    q, r = divmod(x.shape[1], 4)
    return x[:h, : q + r], int(x.shape[0] ** 0.5), x.size()[-2:], torch.Size([1]) + x.shape, x.shape.index(4)


def assert_fmessage(x):
    assert x.dim() == 2, f"got {x.dim()}"
    return x + 1


def getattr_torch_funcs(x):
    return getattr(torch, "relu")(x) + getattr(F, ACT)(x), hasattr(torch, "compile"), callable(getattr(x, "sum", None))


def number_formatting(x):
    return x + 1, "%05.1f" % 3.14159, bin(5), hex(255), oct(8), format(x.shape[0], "03d"), len("abc".encode()), str(1) + str(2.0)


def iinfo_bits(x):
    return x * torch.iinfo(torch.int32).bits, torch.finfo(torch.bfloat16).bits


def list_in_with_none(x):
    opts = [None, "a"]
    return x + 1, None in opts, "b" in opts


def chained_comparison(x):
    n = x.shape[0]
    return x * (0 < n <= 4), 1 < 2 < 3 > 2


def min_of_shapes(x):
    return x[: min(x.shape[0], 2)], min(x.shape), max(*x.shape)


def divmod_neg_round_half(x):
    return x + 1, round(-2.5), round(0.125, 2), divmod(7.5, 2), abs(-0.0), -7 // 2


# ------------------------------------------------------------------ numbers, sizes and tensors in builtins


def pow_tensor(x):
    return pow(x, 2), pow(2, x), abs(-x)


def misc_formats(x):
    return (x + 1, "{:,}".format(1234567), format(0.1, ".5f"), repr(x.shape), f"{x.dtype!r}", sorted("hello"),
            max("abc", key=ord), sum(range(10)), pow(2, -1), complex(1, 2).real, math.isnan(float("nan")))


def min_max_tensor_python_mix(x):
    return max(x.shape[0], 2) * x, min(2.5, x.shape[1])


def float_of_sizes(x):
    return x * float(x.shape[0]) / float(x.numel())


def str_of_tensor_shape_list(x):
    return x + 1, str(list(x.shape)), str(x.shape[0]), "{}x{}".format(*x.shape)


def bool_of_shape_tuple(x):
    return x + 1 if x.shape else x


def len_of_shape_and_dims(x):
    return x * len(x.shape) + len(x.size()) + x.ndim


def hash_of_tuple(x):
    return x + 1, hash((1, "a")) == hash((1, "a"))


CASES = [
    fstring_specs, fstring_conversions, fstring_with_shapes, fstring_nested_spec, percent_formatting,
    str_format_method, str_and_repr_of_constants, str_of_dtype_and_device, string_methods,
    string_predicates, string_split_variants, string_building_keys, string_indexing_and_slicing,
    string_comparison_branch, string_multiplication_concat, string_encode_ord_chr,
    string_method_on_global_str, assert_on_python_values, type_of_values, type_dispatch,
    id_not_leaking, id_of_existing_objects, id_of_singletons_and_frame_sets, id_as_dict_key, isinstance_tuples, isinstance_abcs, isinstance_bool_is_int,
    callable_checks, getattr_hasattr, divmod_round_abs, int_float_bool_conversions, numeric_edge_ops,
    math_on_constants, math_of_tensor_shape, int_of_shape_product, bool_of_python_containers,
    finfo_iinfo, finfo_default, is_tensor_is_floating_point, dtype_comparisons, dtype_properties,
    device_comparisons, torch_size_methods, torch_size_new, get_default_dtype_and_grad,
    element_size_and_numel,
    map_str_join, str_format_misc, fstring_size, int_div_round, version_check,
    fstring_selfdoc,
    string_methods_more,
    type_name_and_class,
    tensor_predicates,
    shape_arith,
    assert_fmessage,
    getattr_torch_funcs,
    number_formatting,
    iinfo_bits,
    list_in_with_none,
    chained_comparison,
    min_of_shapes,
    divmod_neg_round_half,
    pow_tensor, misc_formats, min_max_tensor_python_mix, float_of_sizes, str_of_tensor_shape_list, bool_of_shape_tuple, len_of_shape_and_dims, hash_of_tuple,
]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_corpus_strings_builtins(fn):
    check(fn, X)


def id_of_tensor(x):
    y = x + 1
    return y if id(y) != id(x) else x


def test_id_of_tensor_is_refused_not_guessed():
    import bytegraph
    from bytegraph.errors import Unsupported
    with pytest.raises(Unsupported, match="id\\(\\) of a tensor"):
        bytegraph.compile(id_of_tensor, fullgraph=True)(X)
    check(id_of_tensor, X, graphs=1, fullgraph=False)   # the id() runs eagerly; x + 1 is one graph


def same_object_by_id(x, a, b):
    return x + 1 if id(a) == id(b) else x - 1


def same_object_by_is(x, a, b):
    return x + 1 if a is b else x - 1


@pytest.mark.parametrize("fn, graphs", [(same_object_by_id, 4), (same_object_by_is, 2)],
                         ids=["same_object_by_id", "same_object_by_is"])
def test_identity_of_arguments_is_guarded(fn, graphs):
    import bytegraph
    from helpers import compile_counted
    compiled, cnt = compile_counted(fn, fullgraph=True)
    l1, l2 = [1], [1]
    for args in [(l1, l2), (l1, l1), (l2, l1), (l2, l2)]:
        assert torch.equal(compiled(X, *args), fn(X, *args)), args
    # `is`: one graph for "different", one for "the same". id() of an object from outside is
    # its real number (it may be stored and found again), guarded by identity: a graph per pair.
    assert cnt.frame_count == graphs
    bytegraph.reset()


# ------------------------------------------------------------------ text of tensors
# f"{t}" / str(t) need the tensor's data: the text is made after the graph (as torch.compile
# does), so formatting a tensor costs no graph break.


def fstring_of_tensor(x):
    y = x * 2
    s = f"y={y} sum={y.sum():.3f} {y!r:>5}" + "!"
    return y + 1, s, str(y), "<" + repr(y[0]) + ">"


def fstring_then_in_place(x):
    y = x * 2
    s = f"before {y}"
    y.add_(1)           # the text shows y before this: the graph breaks first
    return y, s


def fstring_then_len(x):
    y = x * 2
    return y, len(f"{y}")


def tensor_in_fstring(x):
    y = x * 2
    return y + 1, f"val {y}"


def test_fstring_of_tensor_is_one_graph():
    from helpers import torch_compile_graphs
    check(fstring_of_tensor, X)      # torch.compile runs this one eagerly (0 graphs)
    cnt, _ = check(tensor_in_fstring, X)
    assert cnt.frame_count == torch_compile_graphs(tensor_in_fstring, (X,)) == 1


def test_text_of_tensor_then_in_place_or_inspected():
    from helpers import check_program
    check_program(fstring_then_in_place, lambda: ((X.clone(),), {}, None), graphs=1, fullgraph=False)
    check_program(fstring_then_len, lambda: ((X.clone(),), {}, None), graphs=1, fullgraph=False)


def test_printing_a_formatted_tensor():
    from helpers import check_program

    def f(x):
        y = x.relu()
        print(f"relu: {y}")
        return y * 2
    check_program(f, lambda: ((X.clone(),), {}, None), graphs=2, fullgraph=False)


# ------------------------------------------------------------------ dtype, finfo, iinfo objects


def dtype_info_objects(x):
    fi = torch.finfo(x.dtype)
    ii = torch.iinfo(torch.int16)
    dt = x.dtype
    return (x.clamp(fi.min, fi.max) * fi.eps, fi.tiny, fi.resolution, fi.dtype, fi.bits, ii.min, ii.bits,
            torch.finfo().eps, torch.finfo(torch.bfloat16).eps, dt.is_floating_point, dt.is_complex,
            dt.itemsize, dt.to_complex(), torch.promote_types(dt, torch.float64), torch.result_type(x, 1),
            torch.can_cast(dt, torch.int32), str(dt), repr(dt), dt in (torch.float16, torch.float32))


def calling_a_dtype_raises(x):
    try:
        torch.float32(3)
    except TypeError as e:
        return x + 1, str(e)
    return x, ""


def test_dtype_and_info_objects():
    check(dtype_info_objects, X)
    check(calling_a_dtype_raises, X)


# ------------------------------------------------------------------ float arguments that change


def scale_by(x, s):
    return x * s + 1


def test_float_argument_changing_between_calls():
    # After the first change the float is a graph input (graph/scalars.py): 2 graphs, as torch.compile.
    from helpers import compile_counted, torch_compile_graphs
    calls = [(X, 0.5), (X, 1.5), (X, 2.5)]
    compiled, cnt = compile_counted(scale_by)
    for args in calls:
        assert torch.allclose(compiled(*args), scale_by(*args))
    assert cnt.frame_count == 2 == torch_compile_graphs(scale_by, *calls)
