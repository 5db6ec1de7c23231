"""Capture of plain Python: variables, operators, containers, calls, builtins, control flow.

Every function here must be captured as exactly one graph (``fullgraph=True``)
and give the same result as eager; see ``helpers.check``.
"""
import math
import operator
import types

import pytest
import torch

from helpers import check

# ---------------------------------------------------------------- module globals

G_SCALE = 3
G_OFFSET = 0.5
G_TENSOR = torch.arange(4, dtype=torch.float32)
G_NAMES = ("a", "b")


class Settings:
    use_relu = True
    depth = 2
    mode = "mul"
    eps = 1e-3


SETTINGS = Settings()
NS = types.SimpleNamespace(scale=2.5, shift=-1)


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def ints(*shape, low=0, high=8):
    return torch.randint(low, high, shape)


# ---------------------------------------------------------------- loads and stores

def test_locals_load_store():
    def f(x):
        a = x + 1
        b = a * 2
        a = b - a
        del b
        c = a
        return c, a

    check(f, t(4))


def test_globals_python_values():
    def f(x):
        return x * G_SCALE + G_OFFSET

    check(f, t(4), ops=2)


def test_global_tensor():
    def f(x):
        return x + G_TENSOR

    check(f, t(3, 4))


def test_global_module_and_attribute_chain():
    def f(x):
        return torch.nn.functional.relu(x) * math.pi

    check(f, t(4))


def test_closure_cell_python_value():
    def make(k):
        def f(x):
            return x * k + 1
        return f

    check(make(7), t(4))


def test_closure_cell_tensor():
    bias = torch.full((4,), 2.0)

    def f(x):
        return x - bias

    check(f, t(2, 4))


def test_nonlocal_read_in_nested_function():
    def f(x):
        y = x + 1
        n = 3

        def inner(z):
            return z * y + n

        return inner(x)

    check(f, t(4))


def test_nonlocal_write_in_nested_function():
    def f(x):
        acc = x

        def add(v):
            nonlocal acc
            acc = acc + v

        add(1)
        add(x)
        return acc

    check(f, t(4))


def test_attribute_loads_on_plain_objects():
    def f(x):
        return x * SETTINGS.depth + SETTINGS.eps, SETTINGS.mode

    check(f, t(4))


def test_attribute_loads_on_simple_namespace():
    def f(x):
        return x * NS.scale + NS.shift

    check(f, t(4))


def test_constants_of_many_types():
    def f(x):
        a = 1
        b = 2.5
        c = True
        d = None
        e = "str"
        g = (1, 2.0, "three")
        return x * a + b, c, d, e, g, x * c

    check(f, t(3))


# ---------------------------------------------------------------- binary operators

FLOAT_BINOPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "pow": lambda a, b: a ** b,
}

INT_BINOPS = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "lshift": lambda a, b: a << b,
    "rshift": lambda a, b: a >> b,
}


@pytest.mark.parametrize("name", sorted(FLOAT_BINOPS))
def test_binop_tensor_tensor_float(name):
    op = FLOAT_BINOPS[name]
    a = torch.rand(3, 4) + 0.5
    b = torch.rand(3, 4) + 0.5
    check(lambda x, y: op(x, y), a, b, ops=1)


@pytest.mark.parametrize("name", sorted(FLOAT_BINOPS))
def test_binop_tensor_tensor_broadcast(name):
    op = FLOAT_BINOPS[name]
    check(lambda x, y: op(x, y), torch.rand(3, 4) + 0.5, torch.rand(4) + 0.5)


@pytest.mark.parametrize("name", sorted(INT_BINOPS))
def test_binop_tensor_tensor_int(name):
    op = INT_BINOPS[name]
    check(lambda x, y: op(x, y), ints(3, 4), ints(3, 4, high=4), ops=1)


@pytest.mark.parametrize("name", ["and", "or", "xor"])
def test_binop_tensor_tensor_bool(name):
    op = INT_BINOPS[name]
    check(lambda x, y: op(x, y), torch.rand(6) > 0.5, torch.rand(6) > 0.5)


def test_matmul_operator():
    def f(x, w, v):
        return x @ w, (x @ w) @ v, v @ v

    check(f, t(3, 4), t(4, 5), t(5))


@pytest.mark.parametrize("name", sorted(FLOAT_BINOPS))
@pytest.mark.parametrize("scalar", [2, 1.5])
def test_binop_tensor_python_scalar(name, scalar):
    op = FLOAT_BINOPS[name]

    def f(x):
        return op(x, scalar), op(scalar, x)

    check(f, torch.rand(3, 4) + 0.5)


@pytest.mark.parametrize("name", sorted(INT_BINOPS))
def test_binop_int_tensor_python_int(name):
    op = INT_BINOPS[name]

    def f(x):
        return op(x, 2), op(3, x)

    check(f, ints(3, 4, high=4))


def test_python_number_arithmetic_mixed_with_tensors():
    def f(x, n):
        m = n * 3 + 1          # 13
        k = m // 2             # 6
        r = m % 5              # 3
        p = 2 ** n             # 16
        q = n / 8              # 0.5
        s = (n << 2) | 1       # 17
        u = (s ^ 3) & 7        # 2
        v = s >> 1             # 8
        w = -n + m - k         # 3
        fl = 1.5 * n - 0.25    # 5.75
        return x * m + k - r + p * q + s + u + v + w + fl, m, k, r, p, q, s, u, v, w, fl

    # All python arithmetic folds away: only tensor ops remain in the graph.
    check(f, t(4), 4, ops=9)


def test_python_float_ops_with_int():
    def f(x, a, b):
        return x * (a / b) + (a // b) + (a % b) + a ** 0.5, a / b, a // b, a % b, -a % b

    check(f, t(4), 7, 2)


# ---------------------------------------------------------------- in-place operators

def test_inplace_operators_on_intermediate_float_tensor():
    def f(x, y):
        z = x.clone()
        z += 1
        z -= y
        z *= 2
        z /= 3
        z **= 2
        z //= 0.5
        z %= 5
        return z

    check(f, torch.rand(3, 4), torch.rand(3, 4))


def test_inplace_operators_on_intermediate_int_tensor():
    def f(x):
        z = x.clone()
        z &= 7
        z |= 8
        z ^= 3
        z <<= 2
        z >>= 1
        return z

    check(f, torch.tensor([13, 2, 99, 40, 7]))     # not ascending: the second call gets them permuted


def test_inplace_matmul_operator():
    def f(x, w):
        z = x + 0
        z @= w
        return z

    check(f, t(3, 3), t(3, 3))


def test_inplace_operator_on_input_tensor_mutates_input():
    def f(x):
        x += 1
        x *= 2
        return x.sum()

    check(f, t(4))


def test_inplace_operators_on_python_numbers():
    def f(x):
        n = 3
        n += 2      # 5
        n *= 4      # 20
        n //= 3     # 6
        n -= 1      # 5
        n **= 2     # 25
        n %= 7      # 4
        n <<= 2     # 16
        n >>= 1     # 8
        n |= 3      # 11
        n &= 14     # 10
        n ^= 5      # 15
        fl = 1.5
        fl /= 2     # 0.75
        fl += n     # 15.75
        return x * n + fl, n, fl

    check(f, t(3), ops=2)


def test_inplace_add_on_tuple_and_list():
    def f(x):
        tup = (x,)
        tup += (x + 1,)
        lst = [x]
        lst += [x * 2]
        lst *= 2
        return tup, lst

    check(f, t(2))


# ---------------------------------------------------------------- unary operators

def test_unary_on_float_tensor():
    def f(x):
        return -x, +x, abs(x)

    check(f, t(4))


def test_invert_on_int_and_bool_tensors():
    def f(i, b):
        return ~i, ~b

    check(f, ints(5), torch.rand(5) > 0.5)


def test_unary_on_python_values():
    def f(x, n, flag):
        a = -n
        b = +n
        c = ~n
        d = not flag
        e = not n
        return x * a + b + c, d, e

    check(f, t(3), 5, True)


# ---------------------------------------------------------------- comparisons

@pytest.mark.parametrize("op", [operator.lt, operator.le, operator.eq, operator.ne,
                                operator.gt, operator.ge])
def test_tensor_comparisons_produce_tensors(op):
    def f(x, y):
        return op(x, y), op(x, 0.0), op(0.5, y)

    # (equal pairs at the end: the second call's values, each scaled by its own factor, order
    # them otherwise, so a result frozen at the first call shows)
    x = torch.tensor([0.0, 1.0, -1.0, 0.5, 1.0, 2.0, -1.0, 0.5])
    y = torch.tensor([0.0, 0.5, -1.0, 2.0, 1.0, 2.0, -1.0, 0.5])
    check(f, x, y)


def test_comparison_operators_in_source_on_tensors():
    def f(x, y):
        return x < y, x <= y, x == y, x != y, x > y, x >= y

    x = torch.tensor([0.0, 1.0, -1.0, 0.5])
    y = torch.tensor([0.0, 0.5, -1.0, 2.0])
    check(f, x, y, ops=6)


def test_comparisons_on_python_constants():
    def f(x, n):
        flags = (n < 3, n <= 3, n == 3, n != 3, n > 3, n >= 3, 1 < n <= 5, 0 < n < 2,
                 "ab" < "b", (1, 2) == (1, 2), [1] != [2], 2.5 > n)
        return x + n, flags

    check(f, t(2), 3)


def test_chained_comparison_in_branch():
    def f(x, n):
        if 0 <= n < 4:
            return x + n
        return x - n

    check(f, t(3), 2)
    check(f, t(3), 9)


def test_comparison_of_shapes():
    def f(x, y):
        if x.shape[0] == y.shape[0] and x.shape[1] > 2:
            return x + y
        return x - y

    check(f, t(3, 4), t(3, 4))


# ---------------------------------------------------------------- identity and membership

def test_is_and_is_not_none():
    def f(x, y=None, z=None):
        out = x * 1.5
        if y is not None:
            out = out + y
        if z is None:
            out = out * 2
        return out

    check(f, t(4), t(4))
    check(f, t(4), None, z=t(4))


def test_is_on_objects_and_types():
    def f(x, obj):
        same_obj = obj is SETTINGS
        same_type = type(x) is torch.Tensor
        return (x + 1 if same_obj else x - 1), same_obj, same_type

    check(f, t(2), SETTINGS)
    check(f, t(2), NS)


def test_in_and_not_in():
    def f(x, n, name):
        a = n in (1, 2, 3)
        b = name not in ["x", "y"]
        c = "scale" in {"scale": 1, "shift": 2}
        d = 3 in range(5)
        e = "b" in G_NAMES
        f_ = "ell" in "hello"
        x = x * 2 if a and b else x - 2
        return x, a, b, c, d, e, f_

    check(f, t(3), 2, "z")
    check(f, t(3), 5, "x")


def test_in_on_dict_argument_keys():
    def f(d):
        out = d["x"]
        if "bias" in d:
            out = out + d["bias"]
        if "scale" not in d:
            out = out * 3
        return out

    check(f, {"x": t(3), "bias": t(3)})


# ---------------------------------------------------------------- building containers, unpacking

def test_build_tuple_list_dict_set_slice():
    def f(x, y):
        tup = (x, y, 1)
        lst = [x + 1, y - 1]
        lst.append(x * y)
        lst.extend([x, y])
        lst.insert(0, y)
        d = {"a": x, "b": y}
        d["c"] = x + y
        d.update(e=y * 3)
        s = slice(1, 3)
        keys = {"k", "k", "j"}
        return tup, lst, d, x[s], len(keys)

    check(f, t(4), t(4))


def test_unpacking_including_starred():
    def f(x, y, z):
        a, b = x, y
        c, *rest = (x, y, z)
        *init, last = [x, y, z]
        first, *mid, end = (x, 1, 2, 3, z)
        (p, q), r = (x, y), z
        return a + b, c, rest, init, last, first, mid, end, p * q + r

    check(f, t(3), t(3), t(3))


def test_unpack_tensor_along_dim0():
    def f(x):
        a, b, c = x
        return a + b * c

    check(f, t(3, 4))


def test_build_with_star_and_double_star():
    def f(x, y):
        base = (x, y)
        extra = {"b": y}
        tup = (*base, x + y)
        lst = [*base, *base]
        d = {"a": x, **extra, "c": 3}
        return tup, lst, d

    check(f, t(2), t(2))


def test_list_and_dict_comprehensions():
    def f(x):
        lst = [x * i for i in range(3)]
        d = {f"k{i}": x + i for i in range(2)}
        evens = [i for i in range(6) if i % 2 == 0]
        return lst, d, evens

    check(f, t(2))


def test_container_methods():
    def f(x):
        lst = [3, 1, 2]
        lst.sort()
        lst.reverse()
        n = lst.pop()
        idx = lst.index(2)
        d = {"a": 1, "b": 2}
        v = d.get("c", 10) + d.get("a") + d.pop("b")
        keys = list(d.keys())
        tup = (1, 2, 2, 3)
        return x * n + v + idx + tup.count(2) + tup.index(3), lst, keys, d

    check(f, t(2))


# ---------------------------------------------------------------- subscripts and slices

def test_tensor_integer_and_negative_index():
    def f(x):
        return x[0], x[-1], x[1, 2], x[0][1]

    check(f, t(3, 4))


def test_tensor_slices():
    def f(x):
        return x[:, 1:3], x[1:], x[::2], x[:-1, ::2], x[1:3, 0]

    check(f, t(4, 5))


def test_tensor_ellipsis_and_none():
    def f(x):
        return x[..., None], x[None], x[:, None, :], x[..., 0], x[None, ..., None]

    check(f, t(2, 3, 4))


def test_tensor_index_with_index_tensor_and_list():
    def f(x, idx):
        return x[idx], x[:, idx], x[[0, 2]]

    check(f, t(4, 5), torch.tensor([0, 3, 1]))


def test_tensor_index_with_slice_object():
    def f(x):
        s = slice(1, None, 2)
        return x[s], x[:, s]

    check(f, t(5, 5))


def test_tensor_setitem():
    def f(x):
        y = x.clone()
        y[0] = 0.0
        y[:, 1] = y[:, 2] * 2
        y[y > 1.0] = 1.0
        return y

    check(f, t(3, 4))


def test_python_list_and_tuple_subscripts():
    def f(xs, tup):
        return xs[0] + xs[-1], xs[1:], tup[::2], tup[1], xs[len(xs) // 2]

    check(f, [t(2), t(2), t(2)], (1, 2, 3, 4))


def test_python_subscripts_with_int_computed_index():
    def f(x, i):
        table = [10, 20, 30, 40]
        return x * table[i] + table[-i], table[i:], table[:i]

    check(f, t(2), 1)


# ---------------------------------------------------------------- calls

def _helper(a, b, c=2, *rest, scale=1.0, **extra):
    out = (a + b) * c * scale
    for r in rest:
        out = out + r
    for k, v in extra.items():
        out = out - v
    return out


def test_call_positional_keyword_star_and_double_star():
    def f(x, y):
        args = (x, y)
        kw = {"scale": 2.0, "bias": 1}
        return (_helper(x, y), _helper(x, y, 3), _helper(*args), _helper(*args, **kw),
                _helper(x, y, 3, x, y, scale=0.5), _helper(a=x, b=y), _helper(x, b=y, c=4, z=2))

    check(f, t(3), t(3))


def test_compiled_function_called_with_keywords():
    def f(x, y, *, alpha=1.0, beta=2):
        return x * alpha + y * beta

    check(f, t(3), y=t(3), alpha=0.5)


def test_compiled_function_with_varargs_signature():
    def f(*xs, **kw):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out * kw["scale"], len(xs), sorted(kw)

    check(f, t(2), t(2), t(2), scale=3, other=None)


def _plain(x):
    return x.sin() + 1


def _calls_plain(x):
    return _plain(x) * 2


def test_inline_user_functions_nested():
    def f(x):
        return _calls_plain(x) + _plain(x)

    check(f, t(4), ops=6)


class _Thing:
    factor = 2

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias

    def twice(self, x):
        return self.apply(self.apply(x))

    @staticmethod
    def static(x):
        return x - 1

    @classmethod
    def cls(cls, x):
        return x * cls.factor

    @property
    def neg_bias(self):
        return -self.bias


def test_inline_methods_static_class_and_property():
    thing = _Thing(3)

    def f(x):
        return thing.twice(x), _Thing.static(x), thing.cls(x), x + thing.neg_bias

    check(f, t(3))


def test_method_on_object_passed_as_argument():
    def f(x, obj):
        return obj.apply(x)

    check(f, t(3), _Thing(1.5))


def test_closures_lambdas_nested_defs_default_args():
    def f(x, y):
        scale = 3
        double = lambda v: v * 2  # noqa: E731

        def affine(v, w=y, b=1):
            return v * scale + w + b

        def make_adder(k):
            return lambda v: v + k

        add5 = make_adder(5)
        return double(x), affine(x), affine(x, b=-1), add5(affine(x, x))

    check(f, t(3), t(3))


def test_recursion_with_python_depth():
    def rec(x, n):
        if n == 0:
            return x
        return rec(x * 2, n - 1) + 1

    def f(x):
        return rec(x, 3)

    check(f, t(3), ops=6)


def test_higher_order_user_function():
    def apply_all(fns, x):
        for fn in fns:
            x = fn(x)
        return x

    def f(x):
        return apply_all([torch.relu, lambda v: v + 1, _plain], x)

    check(f, t(4))


# ---------------------------------------------------------------- operator and math

def test_math_functions_on_constants_fold():
    def f(x, d):
        scale = 1.0 / math.sqrt(d)
        return x * scale + math.log(2.0) + math.floor(2.7) + math.ceil(0.2) + math.pi, scale

    check(f, t(4), 16)


def test_math_on_shape_values():
    def f(x):
        d = x.shape[-1]
        return x / math.sqrt(d)

    check(f, t(2, 9), ops=1)


def test_operator_functions():
    def f(x, y):
        a = operator.mul(x, 2)
        b = operator.add(x, y)
        c = operator.neg(y)
        d = operator.getitem((x, y), 1)
        e = operator.mul(3, 4)
        g = operator.truediv(x, operator.add(1, 1))
        return a, b, c, d, e, g, operator.matmul(x, y)

    check(f, t(3), t(3))


def test_constant_folding_of_python_arithmetic():
    def f(x):
        return x * (2 + 3) - (10 // 3) * 0

    check(f, t(4), ops=2)


# ---------------------------------------------------------------- builtins

def test_isinstance_len_getattr_hasattr():
    def f(x, xs, obj):
        out = x
        if isinstance(x, torch.Tensor):
            out = out + 1
        if isinstance(len(xs), int) and not isinstance(obj, (list, dict)):
            out = out * len(xs)
        if hasattr(obj, "factor"):
            out = out * getattr(obj, "factor")
        if not hasattr(obj, "missing"):
            out = out + getattr(obj, "missing", 10)
        return out, len(x), len(xs), len("abc"), len({"a": 1})

    check(f, t(3, 2), [1, 2, 3], _Thing(0.5))


def test_range_enumerate_zip_min_max_abs_sum():
    def f(x, n):
        out = x
        for i in range(1, n, 2):
            out = out + i
        for i, v in enumerate([10, 20]):
            out = out + i * v
        for a, b in zip([1, 2, 3], (4, 5)):
            out = out * a - b
        m = min(n, 3) + max(n, 3) + min([5, 1, 4]) + max(2, 9, 4) + abs(-n) + sum([1, 2, 3])
        return out * m, m, list(range(n)), list(enumerate("ab")), list(zip([1], [2]))

    check(f, t(3), 5)


def test_builtin_type_conversions():
    def f(x, n):
        a = float(n)
        b = int(2.9)
        c = bool(n)
        d = str(n)
        e = tuple([1, 2])
        g = list((3, 4))
        h = dict(a=1)
        return x * a + b, c, d, e, g, h, round(2.567, 2), divmod(7, 2)

    check(f, t(2), 3)


def test_all_any_sorted_reversed():
    def f(x, vals):
        if all([v > 0 for v in vals]) and any([v > 2 for v in vals]):
            x = x + 1
        return x, sorted(vals), list(reversed(vals))

    check(f, t(2), [3, 1, 2])


# ---------------------------------------------------------------- if / else on Python values

@pytest.mark.parametrize("flag", [True, False])
def test_if_on_bool_argument(flag):
    def f(x, flag):
        if flag:
            return torch.relu(x)
        else:
            return torch.sigmoid(x)

    check(f, t(4), flag, ops=1)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_if_elif_else_on_int_argument(n):
    def f(x, n):
        if n == 0:
            y = x
        elif n < 3:
            y = x * 2
        else:
            y = x - n
        return y if n else y + 1

    check(f, t(4), n)


@pytest.mark.parametrize("bias", [None, 1.5])
def test_if_on_none_argument(bias):
    def f(x, bias=None):
        if bias is None:
            return x * 2
        return x + bias

    check(f, t(3), bias=bias, ops=1)


@pytest.mark.parametrize("use_relu, mode", [(True, "mul"), (False, "add")])
def test_if_on_config_attributes(use_relu, mode):
    cfg = Settings()
    cfg.use_relu = use_relu
    cfg.mode = mode

    def f(x):
        if cfg.use_relu:
            x = torch.relu(x)
        if cfg.mode == "mul":
            x = x * cfg.depth
        elif cfg.mode == "add":
            x = x + cfg.depth
        return x

    check(f, t(4), ops=2 if use_relu else 1)


def test_ternary_and_boolean_operators_on_python_values():
    def f(x, a, b):
        v = a or b
        w = a and b
        u = b if a > 1 else 1 - b
        return x * (v + w + u), v, w, u, (None or "default")   # x * 1: the graph reads x

    check(f, t(2), 0, 3)


def test_assert_on_python_value_is_removed():
    def f(x, n):
        assert n > 0, "n must be positive"
        assert isinstance(x, torch.Tensor)
        return x * n

    check(f, t(2), 2, ops=1)


# ---------------------------------------------------------------- loops (unrolled)

def test_for_over_range_is_unrolled():
    def f(x):
        for _ in range(4):
            x = x * 2
        return x

    check(f, t(3), ops=4)


def test_for_over_list_tuple_and_list_argument():
    def f(x, ws):
        for s in [1, 2, 3]:
            x = x + s
        for s in (0.5, 2.0):
            x = x * s
        for w in ws:
            x = x - w
        return x

    check(f, t(3), [t(3), t(3)], ops=7)


def test_for_over_dict_items_keys_values():
    def f(x, d):
        for k, v in d.items():
            x = x + v if k.startswith("b") else x * v
        for k in d:
            x = x + len(k)
        for v in d.values():
            x = x - v
        return x

    check(f, t(2), {"bias": t(2), "w": t(2), "bb": t(2)})


def test_for_over_enumerate_and_zip_of_tensor_lists():
    def f(xs, ys):
        out = []
        for i, (a, b) in enumerate(zip(xs, ys)):
            out.append(a * b + i)
        return out

    check(f, [t(2), t(2), t(2)], [t(2), t(2), t(2)])


def test_for_with_break_continue_else():
    def f(x):
        for i in range(10):
            if i % 2 == 1:
                continue
            if i > 5:
                break
            x = x + i
        else:
            x = x * 100
        return x

    check(f, t(3), ops=3)


def test_while_loop_on_python_counter():
    def f(x):
        i = 0
        while i < 3:
            x = torch.cos(x)
            i += 1
        return x, i

    check(f, t(3), ops=3)


def test_nested_loops():
    def f(x):
        acc = []
        for i in range(2):
            for j in range(3):
                acc.append(x * (i * 3 + j))
        return torch.stack(acc)

    check(f, t(2))


# ---------------------------------------------------------------- return values

def test_return_tuple_of_tensors_and_ints():
    def f(x):
        return x + 1, 3, x.shape[0], x * 2

    check(f, t(4))


def test_return_list():
    def f(x):
        return [x, x + 1, 7]

    check(f, t(2))


def test_return_dict():
    def f(x):
        return {"out": x * 2, "n": 2, "name": "doubled", "none": None}

    check(f, t(2))


def test_return_nested_mix():
    def f(x, y):
        return {"pair": (x + y, [x - y, {"deep": (x * y, None, 1.5)}]), "shape": x.shape}, [(), {}]

    check(f, t(2, 3), t(2, 3))


def test_return_input_unchanged_and_aliases():
    def f(x, y):
        z = y * 2
        return x, z, z

    cnt, out = check(f, t(3), t(3))
    assert out[1] is out[2], "the same tensor returned twice must be one object"


def test_return_none_with_tensor_in_place_effect():
    def f(x):
        x.mul_(2)
        return None

    check(f, t(3))


def test_return_constant_alongside_computation():
    def f(x):
        y = x + 1
        return y, "done", 42, None, True

    check(f, t(3), ops=1)


# ---------------------------------------------------------------- type annotations

def test_typing_annotations_made_in_the_function():
    # timm's CrossViT: torch.jit.annotate(List[torch.Tensor], []) inside forward. typing's
    # __getitem__ looks at the caller's frame (sys._getframe), so it is made natively.
    import typing

    def fn(x):
        parts = torch.jit.annotate(typing.List[torch.Tensor], [])
        parts.append(x + 1)
        y = typing.cast(typing.Optional[torch.Tensor], parts[0])
        table = typing.cast(typing.Dict[str, typing.Tuple[int, ...]], {"n": (1, 2)})
        kinds = typing.Union[int, typing.Callable[[int], float]]
        return y * len(table["n"]), kinds is typing.Union[int, typing.Callable[[int], float]]

    check(fn, t(3))


G_UNSUPPORTED = frozenset({"mps", "npu"})
G_BY_DTYPE = {torch.float64: G_UNSUPPORTED}


def test_frozenset_read_from_a_global_table():
    # diffusers' maybe_adjust_dtype_for_device: a frozenset found in a module-level dict.
    def fn(x):
        bad = G_BY_DTYPE.get(x.dtype)
        dtype = torch.float32 if bad and x.device.type in bad else x.dtype
        return x.to(dtype) * 2, len(G_UNSUPPORTED), "cpu" in bad

    check(fn, t(3, dtype=torch.float64))


def test_frozenset_changed_in_its_table_recompiles():
    from helpers import compile_counted

    def fn(x):
        return x * 2 if x.device.type in G_BY_DTYPE[torch.float64] else x - 1

    compiled, cnt = compile_counted(fn)
    x = t(3)
    assert torch.equal(compiled(x), fn(x))
    G_BY_DTYPE[torch.float64] = frozenset({"cpu"})
    try:
        assert torch.equal(compiled(x), fn(x))
    finally:
        G_BY_DTYPE[torch.float64] = G_UNSUPPORTED
    assert cnt.frame_count == 2


class _Processor:
    def __call__(self, x, mask=None, scale=1.0):
        return x * scale


def test_signature_parameters_of_a_method():
    # diffusers' Attention.forward: which keyword arguments its processor takes.
    import inspect

    proc = _Processor()

    def fn(x):
        names = set(inspect.signature(proc.__call__).parameters.keys())
        kinds = [p.kind for p in inspect.signature(proc.__call__).parameters.values()]
        return x * len(names) + len(kinds), "scale" in names, sorted(names)

    check(fn, t(3))


class _Backend(str, __import__("enum").Enum):
    FLASH = "flash"
    NATIVE = "native"


def _flash(x):
    return x + 1


def _native(x):
    return x * 2


G_REGISTRY = {_Backend.FLASH: _flash, _Backend.NATIVE: _native, (1, 2): 3, float("inf"): 4}


@pytest.mark.parametrize("which", list(_Backend))
def test_dict_keyed_by_enum_members_tuples_and_inf(which):
    # diffusers' attention dispatch: functions registered under enum members. The guards read
    # the entries by those keys (an enum member's repr is not Python that makes it).
    def fn(x, which):
        return G_REGISTRY[which](x) + G_REGISTRY[(1, 2)] + G_REGISTRY[float("inf")]

    check(fn, t(3), which)
