"""Trace a repeated block once (trace/nn/blocks.py): a module's forward traced for one module is
copied for the next module of its class. With the feature on and off the graphs (their code)
and the guards must be the same, and the results those of eager; where a layer differs in
something its trace depends on, it is traced anew."""
import functools
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bytegraph
from bytegraph.debug import records
from bytegraph.demo.models import GPTConfig, TinyGPT
from bytegraph.testing import CompileCounter
from helpers import assert_same


def _describe(guards):
    # Addresses and hook handle ids differ between two models built alike.
    out = [re.sub(r" at 0x[0-9a-f]+", "", g.describe()) for g in guards]
    return [re.sub(r"\d+", "#", d) if "_hooks" in d else d for d in out]


def capture(make_model, make_inputs, reuse, grad=False, dynamic=None, train=False):
    """(graph codes, guard descriptions, outputs, eager outputs, blocks copied) for one compile."""
    bytegraph.reset()
    torch.manual_seed(0)
    model = make_model()
    model.train(train)
    inputs = make_inputs()
    counter = CompileCounter()
    replayed = []
    from bytegraph.trace.nn import blocks
    original = blocks.Template.replay

    def counting(self, frame, leaves):
        out = original(self, frame, leaves)
        if out is not None:
            replayed.append(type(leaves[0].obj))
        return out

    blocks.Template.replay = counting
    try:
        with bytegraph.config.patch(reuse_traced_blocks=reuse), torch.set_grad_enabled(grad):
            compiled = bytegraph.compile(model, backend=counter, dynamic=dynamic)
            torch.manual_seed(1)
            out = compiled(*inputs)
            torch.manual_seed(1)
            expected = model(*inputs)
    finally:
        blocks.Template.replay = original
    codes = [gm.code for gm in counter.graphs]
    guards = [_describe(r.guards) for r in records.frames]
    return codes, guards, out, expected, replayed


def same_either_way(make_model, make_inputs, copies=None, **kw):
    """Compile with block copies on and off: same graphs, same guards, eager's results.
    ``copies``: {module class: how many of its calls were copies} (when given)."""
    codes_on, guards_on, out_on, expected, copied = capture(make_model, make_inputs, True, **kw)
    codes_off, guards_off, out_off, _, copied_off = capture(make_model, make_inputs, False, **kw)
    assert copied_off == []
    assert codes_on == codes_off
    assert guards_on == guards_off
    assert_same(expected, out_on)
    assert_same(expected, out_off)
    assert copied, "nothing was copied"
    for cls, n in (copies or {}).items():
        assert copied.count(cls) == n, f"{cls.__name__}: {copied.count(cls)} copies, expected {n}"
    return copied


def gpt(n_layer=4, **cfg):
    def make():
        return TinyGPT(GPTConfig(n_layer=n_layer, n_embd=32, n_head=4, block_size=8, vocab_size=64,
                                 dropout=0.0, **cfg))
    return make


def gpt_inputs():
    return (torch.randint(0, 64, (2, 8)),)


def test_tiny_gpt_same_graph_and_guards():
    from bytegraph.demo.models import Block
    same_either_way(gpt(6), gpt_inputs, copies={Block: 5})


def test_tiny_gpt_with_grad():
    same_either_way(gpt(3), gpt_inputs, grad=True)


def test_tiny_gpt_training_mode_with_dropout():
    same_either_way(lambda: TinyGPT(GPTConfig(n_layer=3, n_embd=32, n_head=4, block_size=8, vocab_size=64,
                                               dropout=0.2)), gpt_inputs, grad=True, train=True)


def test_tiny_gpt_dynamic_shapes():
    same_either_way(gpt(3), gpt_inputs, dynamic=True)


def test_sdpa_variant():
    same_either_way(gpt(3, flash=True), gpt_inputs)


class MLPBlock(nn.Module):
    def __init__(self, d, act=F.gelu, scale=1.0, p=0.0):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = act
        self.scale = scale
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.act(self.fc(x))) * self.scale


def seq_inputs():
    # The first block reads a graph input (it has a source), the others a computed tensor: the
    # first two blocks are traced, the rest copied from the second.
    return (torch.randn(3, 16),)


def test_sequential_of_identical_blocks():
    same_either_way(lambda: nn.Sequential(*[MLPBlock(16) for _ in range(5)]), seq_inputs, copies={MLPBlock: 3})


def test_blocks_differing_in_a_constant_are_traced_as_they_are():
    # The copied trace guards scale; each layer's own value must end up in the graph.
    same_either_way(lambda: nn.Sequential(*[MLPBlock(16, scale=float(i + 1)) for i in range(4)]), seq_inputs,
                    copies={MLPBlock: 0, nn.Linear: 2})


def test_blocks_differing_in_a_function_attribute():
    acts = [F.gelu, F.relu, F.gelu, torch.tanh]
    same_either_way(lambda: nn.Sequential(*[MLPBlock(16, act=a) for a in acts]), seq_inputs,
                    copies={MLPBlock: 0, nn.Linear: 2})


def test_blocks_differing_in_a_torch_layer_setting():
    same_either_way(lambda: nn.Sequential(*[MLPBlock(16, p=p) for p in (0.0, 0.5, 0.0, 0.5)]).eval(), seq_inputs,
                    copies={MLPBlock: 1})


class Indexed(nn.Module):
    """The trace depends on the layer's index: branches differ per layer."""

    def __init__(self, i, d=16):
        super().__init__()
        self.i = i
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        if self.i % 2 == 0:
            return torch.relu(self.fc(x))
        return torch.sigmoid(self.fc(x)) + self.i


class IndexedStack(nn.Module):
    def __init__(self, n=4, d=16):
        super().__init__()
        self.layers = nn.ModuleList([Indexed(i, d) for i in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_per_layer_index_changes_the_trace():
    # Layers 0 and 2 take one branch, 1 and 3 the other; i differs in each: no copy of a layer.
    same_either_way(IndexedStack, seq_inputs, copies={Indexed: 0, nn.Linear: 2})


class Shared(nn.Module):
    """The same module called at several depths, and weights tied across layers."""

    def __init__(self, d=16):
        super().__init__()
        self.a = MLPBlock(d)
        self.b = MLPBlock(d)
        self.b.fc.weight = self.a.fc.weight
        self.c = MLPBlock(d)

    def forward(self, x):
        return self.c(self.a(self.b(self.a(x))))


def test_shared_module_and_tied_weights():
    same_either_way(Shared, seq_inputs)


class CallsArg(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x, mask=None, *, scale=1.0, extra=(None, 2)):
        y = self.fc(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return y, extra[1]


class KwargsStack(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.layers = nn.ModuleList([CallsArg() for _ in range(n)])

    def forward(self, x, mask, other_mask=None):
        total = 0
        for i, layer in enumerate(self.layers):
            x, k = layer(x, mask if i % 2 else other_mask, scale=0.5)
            total = total + k
        return x * total


def test_keyword_arguments_constants_and_none_from_arguments():
    mask = torch.rand(3, 16) > 0.5
    same_either_way(KwargsStack, lambda: (torch.randn(3, 16), mask))


def test_layer_with_hooks_is_traced_with_them():
    def make():
        model = nn.Sequential(*[MLPBlock(16) for _ in range(4)])
        model[2].register_forward_hook(lambda m, a, o: o * 2)
        return model
    same_either_way(make, seq_inputs, copies={MLPBlock: 2})   # the hook runs around a copied forward


class Stateful(nn.Module):
    """A block that changes state outside the trace: never copied."""

    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        return self.fc(x)


def test_block_with_side_effects_is_not_copied():
    same_either_way(lambda: nn.Sequential(*[Stateful() for _ in range(3)]), seq_inputs,
                    copies={Stateful: 0, nn.Linear: 1})


def test_copied_blocks_recompile_like_traced_ones():
    torch.manual_seed(0)
    model = nn.Sequential(*[MLPBlock(16) for _ in range(4)])
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert_same(model(x), compiled(x))
        model[3].scale = 3.0
        assert_same(model(x), compiled(x))
        model[2].fc = nn.Linear(16, 16)
        assert_same(model(x), compiled(x))
    assert cnt.frame_count == 3


def test_reuse_can_be_switched_off():
    assert bytegraph.config.reuse_traced_blocks is True
    with bytegraph.config.patch(reuse_traced_blocks=False):
        assert bytegraph.config.reuse_traced_blocks is False
    with pytest.raises(bytegraph.errors.ConfigError):
        bytegraph.config.reuse_traced_blocks = "yes"


# --- reads whose source a trace picks from what it saw first ----------------------------------

_LAYER_KINDS = {}


def _checking_own_forward(cls):
    """A class decorator in the style of transformers' GradientCheckpointingLayer: the wrapper
    reads the class's forward back through its closure."""
    forward = cls.forward

    @functools.wraps(forward)
    def outer(self, *args, **kwargs):
        if type(self).forward is outer:
            return forward(self, *args, **kwargs)
        return forward(self, *args, **kwargs) * 2
    cls.forward = outer
    return cls


@_checking_own_forward
class RegisteredLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        # A registry outside the model names the class (transformers' output recorders), and the
        # layer looks at its submodule's class by name.
        if _LAYER_KINDS["layer"].forward.__name__ == "forward":
            x = x + 1
        if self.norm.__class__.__name__ == "LayerNorm":
            x = self.norm(x)
        return self.fc(x).relu()


_LAYER_KINDS["layer"] = RegisteredLayer


def test_a_function_given_its_source_inside_the_first_block():
    # The first layer reaches its decorated forward without a source, then through the registry:
    # the function value gets that source, so the second layer reads the closure cells through
    # it (and adds ALIAS guards the first did not). The first layer's trace is not a template;
    # the second one is, and the rest are copies of it with the guards a trace makes.
    same_either_way(lambda: nn.Sequential(nn.Linear(16, 16), *[RegisteredLayer() for _ in range(5)]), seq_inputs,
                    copies={RegisteredLayer: 3})


@pytest.mark.parametrize("name, layer, train", [("bert", "BertLayer", False), ("deberta_v2", "DebertaV2Layer", False),
                                                ("vit", "ViTLayer", True), ("bart", "BartEncoderLayer", True)])
def test_transformers_layers_are_copied(name, layer, train):
    pytest.importorskip("transformers")
    from bytegraph.demo import hf_models
    cfg_name, model_name, kwargs, kind = hf_models.ZOO[name]
    deeper = {k: 4 if k in ("num_hidden_layers", "encoder_layers", "decoder_layers") else v
              for k, v in kwargs.items()}
    kw = hf_models.inputs(name, labels=train)

    class Whole(nn.Module):
        def __init__(self):
            super().__init__()
            with pytest.MonkeyPatch.context() as mp:
                mp.setitem(hf_models.ZOO, name, (cfg_name, model_name, deeper, kind))
                self.model = hf_models.build(name)

        def forward(self):
            out = self.model(**kw)
            return hf_models.loss_of(out) if train else out[0]

    copied = same_either_way(Whole, lambda: (), grad=train, train=train)
    assert [c.__name__ for c in copied].count(layer) >= 2


# --- blocks of one class built with different submodules ---------------------------------------

class ConvAct(nn.Sequential):
    """torchvision's Conv2dNormActivation in small: with or without an activation after the layer."""

    def __init__(self, d, act=True):
        super().__init__(*([nn.Linear(d, d)] + ([nn.ReLU(inplace=True)] if act else [])))


class Stack(nn.Module):
    def __init__(self, d, n, act):
        super().__init__()
        self.layers = nn.ModuleList([ConvAct(d, act) for _ in range(n)])

    def forward(self, x):
        return self.layers[-1](x) + self.layers[0](x)


class Pyramid(nn.Module):
    # RetinaNet's shape: the same class built without an activation in one place (the FPN's
    # blocks) and with one in another (the head's), called on tensors of the same shape.
    def __init__(self, d=16):
        super().__init__()
        self.inner = nn.ModuleList([ConvAct(d, act=False) for _ in range(2)])
        self.head = nn.Sequential(*[ConvAct(d, act=True) for _ in range(3)])
        self.stacks = nn.ModuleList([Stack(d, 1, True), Stack(d, 3, True)])

    def forward(self, x):
        x = x * 2
        for block in self.inner:
            x = block(x)
        x = self.head(x)
        return sum(s(x) for s in self.stacks)


def test_blocks_of_one_class_with_other_submodules_are_not_copied_from_each_other():
    same_either_way(Pyramid, seq_inputs)



CALLS = 0


class _CountsCalls(nn.Module):
    """A block whose forward stores to its own attribute on every call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls = self.__dict__.get("calls", 0) + 1
        return self.lin(x) + self.calls


class _CountsCallsGlobally(_CountsCalls):
    def forward(self, x):
        global CALLS
        CALLS += 1
        return self.lin(x) + CALLS


@pytest.mark.parametrize("cls", [_CountsCalls, _CountsCallsGlobally])
def test_a_block_storing_again_to_what_an_earlier_call_stored_is_traced_each_time(cls):
    # From the second call on, each call overwrites the store the one before made (no new key
    # among the pending stores), yet a copy of one would drop the next call's store.
    global CALLS
    shared = cls()

    def run(x):
        for _ in range(3):
            x = shared(x)
        return x
    x = torch.randn(2, 4)
    CALLS, shared.calls = 0, 0
    expected = run(x)
    expected_state = (CALLS, shared.calls)
    CALLS, shared.calls = 0, 0
    actual = bytegraph.compile(run, backend="eager")(x)
    assert torch.allclose(expected, actual) and (CALLS, shared.calls) == expected_state
