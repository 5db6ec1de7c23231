"""The benchmark subjects: what bench/compare.py compiles and times.

Each subject is a ``Subject`` whose ``make()`` returns ``(fn, inputs)``: a
callable (a plain function or an ``nn.Module`` in eval mode) and a tuple of
example inputs, built with fixed seeds so every run sees the same numbers.

* ``pointwise``: ``x + 1`` on a one-element tensor; nearly all of its cost is
  per-call overhead, so it measures the front end's guard/dispatch path.
* ``pointwise_chain``: a short chain of pointwise ops on 1024 elements.
* ``mlp``: three Linear layers with ReLU (``bytegraph.demo.models.MLP``).
* ``tinygpt``: the 2-layer nanoGPT-style model (``bytegraph.demo.models.TinyGPT``).
* ``cnn``: a small Conv2d/BatchNorm2d/ReLU/MaxPool CNN, defined here.
* ``hf_gpt2``, ``hf_bert``, ``hf_llama``, ``hf_t5``: tiny transformers models
  (``bytegraph.demo.hf_models``), called with ``input_ids``; only when transformers is installed.
"""
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def _load_demo_models():
    """``bytegraph.demo.models``, even while the bytegraph package itself fails to import.

    The demo models depend only on torch; loading the file directly keeps the
    torch.compile half of the benchmark usable whatever state bytegraph is in.
    """
    try:
        from bytegraph.demo import models
        return models
    except Exception:
        path = Path(__file__).resolve().parent.parent / "bytegraph" / "demo" / "models.py"
        spec = importlib.util.spec_from_file_location("_bench_demo_models", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
        return module


demo_models = _load_demo_models()


def pointwise(x):
    return x + 1


def pointwise_chain(x):
    y = x * 2 + 1
    y = torch.sin(y) * torch.cos(x)
    return torch.relu(y - 0.5) / (1 + x.abs())


class SmallCNN(nn.Module):
    """Two conv blocks (Conv2d, BatchNorm2d, ReLU, MaxPool2d), global pooling, Linear."""

    def __init__(self, in_channels=3, num_classes=10, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


@dataclass(frozen=True)
class Subject:
    name: str
    description: str
    make: Callable[[], tuple]   # () -> (callable, tuple of inputs)


def _seeded(fn, *args, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn(*args)


def _make_pointwise():
    return pointwise, (torch.ones(1),)


def _make_pointwise_chain():
    return pointwise_chain, (_seeded(torch.randn, 1024),)


def _make_demo(name):
    def make():
        model = demo_models.make_model(name)
        return model, demo_models.make_inputs(name, model)
    return make


def _make_cnn():
    model = _seeded(SmallCNN).eval()
    # Non-trivial running statistics, so BatchNorm does real work in eval mode.
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return model, (_seeded(torch.randn, 4, 3, 32, 32, seed=2),)


def _make_hf(name):
    def make():
        from bytegraph.demo import hf_models
        model = hf_models.build(name).eval()
        kw = hf_models.inputs(name)
        if name == "t5":
            def run(input_ids, decoder_input_ids):
                return model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
            return run, (kw["input_ids"], kw["decoder_input_ids"])

        def run(input_ids):
            return model(input_ids=input_ids)
        return run, (kw["input_ids"],)
    return make


def _hf_available():
    return importlib.util.find_spec("transformers") is not None


SUBJECTS = {s.name: s for s in (
    Subject("pointwise", "x + 1 on a 1-element tensor", _make_pointwise),
    Subject("pointwise_chain", "10 pointwise ops on 1024 elements", _make_pointwise_chain),
    Subject("mlp", "3 Linear + ReLU, batch 8x64", _make_demo("mlp")),
    Subject("tinygpt", "nanoGPT-style, 2 layers, n_embd 64, batch 2x32", _make_demo("tinygpt")),
    Subject("cnn", "2x(Conv2d/BN/ReLU/MaxPool) + pool + Linear, 4x3x32x32", _make_cnn),
)}
if _hf_available():
    for _name, _what in (("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel"), ("llama", "LlamaForCausalLM"),
                         ("t5", "T5ForConditionalGeneration")):
        SUBJECTS[f"hf_{_name}"] = Subject(f"hf_{_name}", f"transformers {_what}, 2 layers, tiny config, ids 2x16",
                                          _make_hf(_name))
