"""What model code calls besides tensors: the environment, modules and objects made in forward,
configs copied and changed, torch.utils._pytree, NumPy on numbers, ModelOutput conversions.

Every test compares the compiled function with eager (and counts graphs where the point is
that no graph break is needed).
"""
import abc
import collections
import copy
import os

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import bytegraph
from bytegraph.testing import CompileCounter, same
from helpers import assert_traced


def compiled(fn, fullgraph=True):
    cnt = CompileCounter()
    return bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph), cnt


def t(*shape):
    return torch.randn(*shape) if shape else torch.randn(3)


# --- the environment ---------------------------------------------------------------------

FLAG, NUM, SET = "BYTEGRAPH_TEST_FLAG", "BYTEGRAPH_TEST_NUM", "BYTEGRAPH_TEST_SET"


def reads_environment(x):
    if os.environ.get(FLAG, "0") == "1":
        x = x + 1
    if FLAG in os.environ:
        x = x * 2
    n = os.getenv(NUM)
    if n is not None:
        x = x * int(n)
    return x.sin()


def test_environment_reads_fold_under_a_guard_on_each_value(monkeypatch):
    fn, cnt = compiled(reads_environment)
    x = t()
    settings = [{}, {FLAG: "1"}, {FLAG: "0", NUM: "3"}, {NUM: "3"}, {}, {FLAG: "1"}]
    for env in settings:
        for k in (FLAG, NUM):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert same(fn(x), reads_environment(x)), env
    assert cnt.frame_count == 4   # the last two settings hit the cache


def sets_environment(x):
    os.environ[SET] = "yes"
    y = x + (1 if os.environ[SET] == "yes" else 0)
    del os.environ[SET]
    gone = SET not in os.environ
    os.environ[FLAG] = "set-inside"
    return y, gone


def test_environment_stores_are_replayed_after_the_graph(monkeypatch):
    monkeypatch.setenv(SET, "before")
    monkeypatch.delenv(FLAG, raising=False)
    fn, cnt = compiled(sets_environment)
    x = t()
    y, gone = fn(x)
    assert same(y, x + 1) and gone is True
    assert SET not in os.environ and os.environ[FLAG] == "set-inside"
    assert cnt.frame_count == 1


def test_missing_environment_variable_raises_key_error_as_eager(monkeypatch):
    monkeypatch.delenv(NUM, raising=False)

    def f(x):
        try:
            return x * int(os.environ[NUM])
        except KeyError:
            return x - 1
    fn, cnt = compiled(f)
    x = t()
    assert same(fn(x), x - 1)


# --- modules and objects made in forward -------------------------------------------------

class Swish(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class ScaledTanh(torch.nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale
        self.inner = torch.nn.Tanh()

    def forward(self, x):
        return self.inner(x) * self.scale


class Instantier(collections.OrderedDict):
    """HF's ClassInstantier: each lookup makes a new module from (class, kwargs)."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACTIVATIONS = Instantier(swish=Swish, tanh2=(ScaledTanh, {"scale": 2.0}), relu=torch.nn.ReLU)


class UsesActivations(torch.nn.Module):
    def __init__(self, names):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.names = names

    def forward(self, x):
        for name in self.names:
            x = ACTIVATIONS[name](self.lin(x))
        return Swish()(x) + ScaledTanh(0.5)(x)


def test_modules_made_in_forward_are_traced():
    torch.manual_seed(0)
    model = UsesActivations(["swish", "tanh2", "relu"])
    fn, cnt = compiled(model)
    x = t(2, 4)
    assert same(fn(x), model(x))
    assert same(fn(x), model(x))
    assert cnt.frame_count == 1


class CountsInstances(torch.nn.Module):
    made = 0

    def __init__(self):
        super().__init__()
        CountsInstances.made += 1   # an effect outside the module: replayed on every call

    def forward(self, x):
        return x + 1


def test_module_init_effects_happen_on_every_call():
    def f(x):
        return CountsInstances()(x)
    fn, cnt = compiled(f, fullgraph=False)
    start = CountsInstances.made
    x = t()
    for i in range(3):
        assert same(fn(x), x + 1)
    assert CountsInstances.made == start + 3
    assert_traced()     # broken at the class attribute's write, rather than run unread


def test_module_with_parameters_made_in_forward_breaks_the_graph():
    def f(x):
        return (torch.nn.Linear(3, 3)(x) * 0).sum() + SwishWithWeight()(x).sum()

    class SwishWithWeight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w

    with pytest.raises(bytegraph.Unsupported, match="parameters or buffers|Linear"):
        compiled(f)[0](t())
    bytegraph.reset()
    fn, _ = compiled(f, fullgraph=False)
    x = t()
    assert same(fn(x), f(x))
    assert_traced()


class Meta(type):
    def __setattr__(cls, name, value):   # a metaclass that only customises class attributes
        super().__setattr__(name, value)


class Record(metaclass=Meta):
    def __init__(self, a):
        self.a = a


class Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self):
        ...


def test_classes_with_a_metaclass_keeping_type_call_are_made_in_the_trace():
    def f(x):
        return Record(x * 2).a + 1
    fn, cnt = compiled(f)
    x = t()
    assert same(fn(x), f(x)) and cnt.frame_count == 1

    def g(x):
        try:
            Abstract()
        except TypeError:
            return x - 1
        return x
    bytegraph.reset()
    fn, _ = compiled(g, fullgraph=False)
    assert same(fn(x), x - 1)
    assert_traced()     # the abstract class's call broke the graph; it raises natively


# --- configs copied, validated, changed ---------------------------------------------------

class Config:
    attribute_map = {"layers": "num_layers"}

    def __init__(self):
        self.num_layers = 2
        self.decoder_layers = 3
        self.scale = 0.5

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        if key == "scale" and not isinstance(value, float):
            raise TypeError("scale must be a float")
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def decoder_view(cfg, x):
    view = copy.deepcopy(cfg)
    for key in list(vars(view)):
        if key.startswith("decoder_"):
            value = getattr(view, key)
            delattr(view, key)
            setattr(view, key[len("decoder_"):], value)
    return x * view.layers + view.scale, hasattr(view, "decoder_layers")


def test_deep_copied_config_changed_with_setattr_and_delattr():
    cfg = Config()
    fn, cnt = compiled(decoder_view)
    x = t()
    assert same(fn(cfg, x), decoder_view(cfg, x))
    assert cfg.decoder_layers == 3 and not hasattr(cfg, "layers_") and cnt.frame_count == 1


def stores_on_config(cfg, x):
    if cfg.scale == 0.5:
        cfg.scale = 0.25            # through Config.__setattr__ (traced), replayed after the graph
        cfg.layers = 4              # renamed by attribute_map
    return x * cfg.scale * cfg.num_layers


def test_python_setattr_of_an_existing_object_is_traced_and_replayed():
    fn, cnt = compiled(stores_on_config)
    x = t()
    cfg, ref = Config(), Config()
    assert same(fn(cfg, x), stores_on_config(ref, x))
    assert (cfg.scale, cfg.num_layers) == (ref.scale, ref.num_layers) == (0.25, 4)
    assert same(fn(cfg, x), stores_on_config(ref, x))   # scale changed: guard fails, recompiles
    assert cnt.frame_count == 2


# --- torch.utils._pytree, NumPy on numbers, min/max of sizes ---------------------------------

Pair = collections.namedtuple("Pair", "a b")


def uses_pytree(x, y):
    tree = {"a": (x, y), "b": [x * 2, None, 3], "c": Pair(y, 1.5)}
    leaves, spec = pytree.tree_flatten(tree)
    doubled = pytree.tree_unflatten([v * 2 if isinstance(v, torch.Tensor) else v for v in leaves], spec)
    plus = pytree.tree_map(lambda v: v + 1 if isinstance(v, torch.Tensor) else v, doubled)
    return plus, len(pytree.tree_leaves(tree)), pytree.tree_map(lambda a, b: a * b, (x, y), (y, x))


def test_pytree_flatten_unflatten_map():
    fn, cnt = compiled(uses_pytree)
    x, y = t(), t()
    assert same(fn(x, y), uses_pytree(x, y)) and cnt.frame_count == 1


def uses_numpy(x):
    n = np.lcm(4, 6)
    m = int(np.prod((2, 3)))
    return x * int(n) + m + float(np.sqrt(16.0)), n, np.float32(2.5) * 2


def test_numpy_on_python_numbers_folds_to_constants():
    fn, cnt = compiled(uses_numpy)
    x = t()
    out, ref = fn(x), uses_numpy(x)
    assert same(out[0], ref[0]) and out[1:] == ref[1:] and type(out[1]) is type(ref[1])
    assert type(out[2]) is type(ref[2]) and cnt.frame_count == 1


def test_numpy_array_results_break_the_graph():
    def f(x):
        return x + int(np.arange(3).sum())
    with pytest.raises(bytegraph.Unsupported, match="NumPy array"):
        compiled(f)[0](t())


def test_min_max_of_symbolic_sizes_stays_symbolic():
    def f(x):
        n = max(x.shape[0] - 4, 0)
        return x[n:] * min(x.shape[0], 100)
    fn, cnt = compiled(f)
    for size in (6, 7, 8, 2, 9):
        x = t(size)
        assert same(fn(x), f(x)), size
    assert cnt.frame_count == 2   # static first, then one dynamic graph for every size


# --- ModelOutput conversions ----------------------------------------------------------------

def test_model_output_conversions():
    outputs = pytest.importorskip("transformers.modeling_outputs")

    def made(x):
        out = outputs.CausalLMOutputWithPast(logits=x * 2, loss=x.sum())
        items = list(out.items())
        return (out.to_tuple()[0], out[0], out["logits"], list(out.keys()), len(list(out.values())),
                items[1][1], "loss" in out, dict(out)["loss"], len(out))

    def given(out):
        return (out.to_tuple()[0] + 1, out[0], out["last_hidden_state"], list(out.keys()),
                list(out.values())[0], "hidden_states" in out, len(out))

    x = t()
    fn, cnt = compiled(made)
    assert same(fn(x), made(x)) and cnt.frame_count == 1
    fn, cnt = compiled(given)
    out = outputs.BaseModelOutput(last_hidden_state=t(2))
    assert same(fn(out), given(out)) and cnt.frame_count == 1


# --- tables keyed by types, read through bound builtin methods ---------------------------------

VALIDATORS = {int: lambda v: v * 2, float: lambda v: v + 0.5}


def validates(x, n):
    check = VALIDATORS.get(type(n))
    scale = check(n) if check is not None else 1
    return x * scale, str in VALIDATORS, VALIDATORS.get(str, "none")


def test_lookups_in_a_dict_keyed_by_types_are_guarded():
    fn, cnt = compiled(validates)
    x = t()
    for n in (3, 3, 2.0, 2.0):
        assert same(fn(x, n), validates(x, n)), n
    assert cnt.frame_count == 2   # the int, then the float; the repeats hit the cache
    VALIDATORS[float] = lambda v: v * 10   # a new entry object: recompiles, sees it
    try:
        assert same(fn(x, 2.0), validates(x, 2.0))
        assert cnt.frame_count == 3
    finally:
        VALIDATORS[float] = lambda v: v + 0.5
