"""The persistent cache (runtime/persist.py): compiled frames saved on disk and used by a later
process (here: a fresh model after bytegraph.reset(), and real child processes), never when a
guard or a fingerprint says the saved frame does not apply, never failing on a bad file."""
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import bytegraph
from bytegraph.debug import records
from bytegraph.runtime import persist
from helpers import assert_same

ROOT = Path(__file__).resolve().parent.parent


class Net(nn.Module):
    def __init__(self, scale=0.5, d=8):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(3)])
        self.norm = nn.LayerNorm(d)
        self.scale = scale

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) * self.scale + x
        return self.norm(x)


@pytest.fixture
def cache(tmp_path):
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(tmp_path)):
        yield tmp_path


def entries(path):
    return sorted(p for p in Path(path).rglob("*" + persist._SUFFIX))


def loaded_from_disk(caplog):
    return any("loaded from the persistent cache" in r.getMessage() for r in caplog.records)


def run(model, x, backend="eager"):
    compiled = bytegraph.compile(model, backend=backend)
    with torch.no_grad():
        out = compiled(x)
        assert_same(model(x), out, atol=1e-5)
    return out


@pytest.fixture
def cache_log(caplog):
    with bytegraph.config.patch(log_topics=["cache"]):
        caplog.set_level(logging.DEBUG, logger="bytegraph.cache")
        yield caplog


def test_saved_then_loaded_for_a_new_model(cache, cache_log):
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    run(Net(), x)
    assert len(entries(cache)) == 1
    assert not loaded_from_disk(cache_log)
    bytegraph.reset()
    torch.manual_seed(1)     # other weights: the graph reads this model's parameters
    model = Net()
    run(model, x)
    assert loaded_from_disk(cache_log)
    # The loaded entry guards this process's objects: a change still recompiles.
    model.scale = 2.0
    run(model, x)
    model.layers[1] = nn.Linear(8, 8)
    run(model, x)


def test_not_loaded_when_a_guard_fails(cache, cache_log):
    x = torch.randn(2, 8)
    run(Net(scale=0.5), x)
    bytegraph.reset()
    cache_log.clear()
    run(Net(scale=3.0), x)            # another constant: traced, not loaded
    assert not loaded_from_disk(cache_log)
    bytegraph.reset()
    cache_log.clear()
    run(Net(d=16), torch.randn(2, 16))   # other shapes
    assert not loaded_from_disk(cache_log)
    bytegraph.reset()
    cache_log.clear()
    run(Net(), torch.randn(2, 8).double().float().to(torch.float64).float())
    assert loaded_from_disk(cache_log)


def apply_fn(x, fn):
    return fn(x)


class Stack(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_saved_entry_is_not_loaded_for_other_objects(cache, cache_log):
    # An identity guard read back from disk must compare the object there now: a function
    # passed as an argument, and the layers a ModuleList holds (its keys are guarded).
    x = torch.ones(1, 2)
    compiled = bytegraph.compile(apply_fn, backend="eager")
    assert_same(torch.sin(x), compiled(x, torch.sin))
    assert len(entries(cache)) == 1
    cache_log.clear()
    assert_same(torch.cos(x), compiled(x, torch.cos))     # the saved entry (sin) does not apply
    assert not loaded_from_disk(cache_log)
    for n in (1, 2, 3):
        torch.manual_seed(n)
        cache_log.clear()
        run(Stack(n), x)
        assert not loaded_from_disk(cache_log), n            # other layers than the saved stacks'
    # What was saved is loaded for the objects it was saved for (as by a new process).
    bytegraph.reset()
    cache_log.clear()
    assert_same(torch.cos(x), bytegraph.compile(apply_fn, backend="eager")(x, torch.cos))
    assert loaded_from_disk(cache_log)


class Scaler:
    def __call__(self, x):
        return x * 2


SCALER = Scaler()


def apply_scaler(x):
    return SCALER(x) + 1


def test_a_saved_entry_is_not_loaded_after_a_method_is_replaced(cache, cache_log):
    # The entry names Scaler.__call__ by reference, which finds the new function once the class
    # has another; its code tells them apart (this process loads what it saved, too).
    x = torch.ones(2)
    original = Scaler.__call__
    compiled = bytegraph.compile(apply_scaler, backend="eager")
    try:
        assert_same(apply_scaler(x), compiled(x))
        assert len(entries(cache)) == 1
        Scaler.__call__ = lambda self, x: x * 7
        cache_log.clear()
        assert_same(apply_scaler(x), compiled(x))
        assert not loaded_from_disk(cache_log)
    finally:
        Scaler.__call__ = original
    assert_same(apply_scaler(x), compiled(x))
    # With the original method back, a new compile loads the entry saved for it.
    bytegraph.reset()
    cache_log.clear()
    assert_same(apply_scaler(x), bytegraph.compile(apply_scaler, backend="eager")(x))
    assert loaded_from_disk(cache_log)


def autocast_and_no_grad_with_a_break(a):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            y = a @ a
            print("inside both blocks")
        w = y @ a
    return w.float() + a, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")


def test_a_loaded_resume_function_is_compiled_under_the_state_it_starts_in(cache, cache_log, capsys):
    # Loading propagates fake values through the graph, running its grad-mode and autocast
    # nodes: the state is put back before the backend compiles (else AOTAutograd traced the
    # matmul after `no_grad` ends without autocast's casts).
    a = torch.randn(3, 3, requires_grad=True)
    expected = autocast_and_no_grad_with_a_break(a)
    for attempt in range(2):
        bytegraph.reset()
        out = bytegraph.compile(autocast_and_no_grad_with_a_break, backend="aot_eager")(a)
        assert (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")) == (True, False)
        assert out[1:] == expected[1:]
        assert torch.equal(out[0], expected[0]) and out[0].requires_grad
    assert loaded_from_disk(cache_log)


def test_corrupt_and_stale_files_are_ignored(cache, cache_log):
    x = torch.randn(2, 8)
    run(Net(), x)
    (path,) = entries(cache)
    path.write_bytes(b"not a pickle")
    persist._loaded.clear()
    bytegraph.reset()
    cache_log.clear()
    run(Net(), x)
    assert not loaded_from_disk(cache_log)
    assert any("unreadable" in r.getMessage() for r in cache_log.records)
    # A file written by other versions (same name, other contents).
    record = {"format": persist.FORMAT, "key": path.parent.name, "python": "2.7", "torch": "0",
              "bytegraph": "x"}
    import pickle
    for p in entries(cache):
        p.write_bytes(pickle.dumps(record))
    persist._loaded.clear()
    bytegraph.reset()
    cache_log.clear()
    run(Net(), x)
    assert not loaded_from_disk(cache_log)
    assert any("stale" in r.getMessage() for r in cache_log.records)


def test_off_and_unnamed_backends_save_nothing(tmp_path):
    x = torch.randn(2, 8)
    with bytegraph.config.patch(persistent_cache=False, cache_dir=str(tmp_path)):
        run(Net(), x)
    assert entries(tmp_path) == []
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(tmp_path)):
        run(Net(), x, backend=lambda gm, ex: gm.forward)
    assert entries(tmp_path) == []
    # The same compile with the cache on and a named backend saves its entry.
    bytegraph.reset()
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(tmp_path)):
        run(Net(), x)
    assert len(entries(tmp_path)) == 1


def test_trace_relying_on_set_order_is_not_saved(cache):
    names = {"alpha", "beta", "gamma"}

    def f(x):
        out = []
        for n in names:
            out.append(n)
        return x * len(out), out

    compiled = bytegraph.compile(f, backend="eager")
    x = torch.ones(2)
    assert_same(f(x), compiled(x))
    assert entries(cache) == []

    ordered = sorted(names)

    def g(x):
        out = []
        for n in ordered:      # a list: its order is the same in every process
            out.append(n)
        return x * len(out), out

    assert_same(g(x), bytegraph.compile(g, backend="eager")(x))
    assert len(entries(cache)) == 1


MODULE = '''
import torch
import torch.nn as nn


def act(x):
    return torch.relu(x) {op} 1.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return act(self.lin(x))
'''


def test_not_loaded_after_the_source_of_a_called_function_changes(cache, cache_log, tmp_path, monkeypatch):
    import importlib
    moddir = tmp_path / "mods"
    moddir.mkdir()
    path = moddir / "blockmod_fp.py"
    path.write_text(MODULE.format(op="+"))
    monkeypatch.syspath_prepend(str(moddir))
    mod = importlib.import_module("blockmod_fp")
    x = torch.randn(3, 4)
    run(mod.Block(), x)
    bytegraph.reset()
    run(mod.Block(), x)
    assert loaded_from_disk(cache_log)
    # act() changes; Block.forward (the compiled frame's code) does not.
    path.write_text(MODULE.format(op="-"))
    os.utime(path, ns=(1, 1))
    mod = importlib.reload(mod)
    bytegraph.reset()
    cache_log.clear()
    run(mod.Block(), x)
    assert not loaded_from_disk(cache_log)
    assert any("changed" in r.getMessage() for r in cache_log.records)


CHILD = '''
import json, sys, logging
sys.path.insert(0, sys.argv[1])
import torch, bytegraph
import blockmod
bytegraph.config.log_topics = ["cache"]
seen = []
class H(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage())
logging.getLogger("bytegraph.cache").addHandler(H())
logging.getLogger("bytegraph.cache").setLevel(logging.DEBUG)
torch.manual_seed(0)
m = blockmod.Block()
x = torch.randn(3, 4)
c = bytegraph.compile(m, backend="eager")
with torch.no_grad():
    out = c(x)
    ok = torch.allclose(out, m(x))
print(json.dumps({"ok": bool(ok), "loaded": any("loaded from" in s for s in seen)}))
'''


def test_concurrent_writers_then_a_process_that_loads(tmp_path):
    # Child processes (hash seeds differ between them): two write at once, a third loads.
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "blockmod.py").write_text(MODULE.format(op="*"))
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, BYTEGRAPH_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               BYTEGRAPH_PERSISTENT_CACHE="1")

    def start():
        return subprocess.Popen([sys.executable, "-c", CHILD, str(moddir)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def result(p):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    writers = [start(), start()]
    assert [result(p)["ok"] for p in writers] == [True, True]
    assert len(entries(cache_dir)) == 1 and not list(Path(cache_dir).rglob(".tmp-*"))
    assert result(start()) == {"ok": True, "loaded": True}


INDUCTOR_CHILD = r'''
import json, torch, bytegraph
from torch._dynamo.utils import counters
torch.manual_seed(0)

def f(x, w):
    return torch.tanh(x @ w) * 2 + x.sum()

x, w = torch.randn(4, 4), torch.randn(4, 4)
with bytegraph.config.patch(regional_compile=False):
    out = bytegraph.compile(f, backend="inductor")(x, w)
print(json.dumps({"ok": bool(torch.allclose(out, f(x, w), atol=1e-5)),
                  "fx": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"])}))
'''


def test_a_static_graph_hits_inductors_own_caches_in_the_next_process(tmp_path):
    # A graph with static sizes gets real example inputs; Inductor's FX graph cache and
    # AOTAutograd's cache then found no ShapeEnv and never cached it, so a warm process compiled
    # it all again.
    env = dict(os.environ, BYTEGRAPH_CACHE_DIR=str(tmp_path / "bg"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"),
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", BYTEGRAPH_PERSISTENT_CACHE="1")

    def child():
        p = subprocess.run([sys.executable, "-c", INDUCTOR_CHILD], env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["ok"] and warm["ok"]
    assert cold["aot"].get("autograd_cache_saved") == 1, cold
    assert warm["aot"].get("autograd_cache_hit") == 1 and warm["fx"].get("fxgraph_cache_hit") == 1, warm
