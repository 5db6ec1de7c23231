"""The README's environment switches and ``python -m bytegraph.demo``, each doing what it says.

Every variable is read once, at import (bytegraph/config.py), so each run is a fresh process:
once with every switch set to its non-default value, once with none set, and the same program
observes in both what each switch changes.
"""
import json
import os
import subprocess
import sys

import bytegraph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(bytegraph.__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))

OBSERVE = r'''
import json, os, sys, warnings
import numpy as np
import torch
import bytegraph
from bytegraph.backends import regions
from bytegraph.demo.models import GPTConfig, TinyGPT
from bytegraph.trace.nn import blocks
from helpers import splitting_backend
import replay_fault

warnings.simplefilter("ignore")
seen = {"config": {k: getattr(bytegraph.config, k) for k in
                   ("trace_numpy", "reuse_traced_blocks", "regional_compile", "persistent_cache",
                    "replay_record_enabled")}}

def gpt(n):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(n_layer=n, n_embd=32, n_head=4, block_size=8, vocab_size=64, dropout=0.0))

x = torch.randint(0, 64, (2, 8))

# BYTEGRAPH_TRACE_NUMPY: NumPy on arrays traced, or run natively at a break.
def numpy_fn(a):
    return np.sum(a * 2, axis=0)
explained = bytegraph.explain(numpy_fn)(np.ones((3, 2), dtype=np.float32))
seen["numpy_breaks"] = [b.reason for b in explained.break_reasons]
bytegraph.reset()

# BYTEGRAPH_REUSE_BLOCKS: the trace of a repeated block copied for the other layers.
copies = []
replay = blocks.Template.replay
def counting(self, *args, **kwargs):
    out = replay(self, *args, **kwargs)
    if out is not None:
        copies.append(1)
    return out
blocks.Template.replay = counting
model = gpt(3)
with torch.no_grad():
    assert torch.allclose(bytegraph.compile(model, backend="eager")(x), model(x), atol=1e-5)
blocks.Template.replay = replay
seen["block_copies"] = len(copies)
bytegraph.reset()

# BYTEGRAPH_REGIONAL_COMPILE: a graph of repeated blocks split at them.
parts, outer = [], []
model = gpt(3)
with torch.no_grad():
    out = bytegraph.compile(model, backend=splitting_backend(regions.compile_by_regions, parts, outer))(x)
    assert torch.allclose(out, model(x), atol=1e-5)
seen["regional_parts"] = len(parts)
bytegraph.reset()

# BYTEGRAPH_PERSISTENT_CACHE: compiled frames saved under BYTEGRAPH_CACHE_DIR.
def cached(t):
    return t.sin() * 2
bytegraph.compile(cached, backend="eager")(torch.ones(3))
seen["cache_files"] = sum(len(files) for _, _, files in os.walk(os.environ["BYTEGRAPH_CACHE_DIR"]))
bytegraph.reset()

# BYTEGRAPH_REPLAY_RECORD: an internal error while tracing writes a record.
def deliberately_failing(t):
    return t + 1
replay_fault.install()
assert torch.equal(bytegraph.compile(deliberately_failing, backend="eager")(torch.ones(2)), torch.ones(2) + 1)
replay_fault.uninstall()
seen["replay_records"] = sorted(os.listdir(os.environ["BYTEGRAPH_REPLAY_RECORD_DIR"]))
print(json.dumps(seen))
'''

SWITCHED = {"BYTEGRAPH_TRACE_NUMPY": "0", "BYTEGRAPH_REUSE_BLOCKS": "0", "BYTEGRAPH_REGIONAL_COMPILE": "0",
            "BYTEGRAPH_PERSISTENT_CACHE": "0", "BYTEGRAPH_REPLAY_RECORD": "1"}


def observe(tmp_path, switches):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYTEGRAPH_")}
    env.update(switches, PYTHONPATH=os.pathsep.join([ROOT, TESTS]), OMP_NUM_THREADS="1",
               BYTEGRAPH_CACHE_DIR=str(tmp_path / "cache"), BYTEGRAPH_REPLAY_RECORD_DIR=str(tmp_path / "replay"))
    (tmp_path / "replay").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", OBSERVE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_environment_switches(tmp_path):
    default = observe(tmp_path / "default", {})
    switched = observe(tmp_path / "switched", SWITCHED)
    assert default["config"] == {"trace_numpy": True, "reuse_traced_blocks": True, "regional_compile": True,
                                 "persistent_cache": True, "replay_record_enabled": False}
    assert switched["config"] == {"trace_numpy": False, "reuse_traced_blocks": False, "regional_compile": False,
                                  "persistent_cache": False, "replay_record_enabled": True}
    # BYTEGRAPH_TRACE_NUMPY=0: the NumPy code runs natively, at a break that says why.
    assert default["numpy_breaks"] == []
    assert any("NumPy tracing is off" in r for r in switched["numpy_breaks"]), switched["numpy_breaks"]
    # BYTEGRAPH_REUSE_BLOCKS=0: the blocks after the first are traced, not copied.
    assert default["block_copies"] > 0 and switched["block_copies"] == 0
    # BYTEGRAPH_REGIONAL_COMPILE=0: the graph is compiled whole.
    assert default["regional_parts"] == 3 and switched["regional_parts"] == 0
    # BYTEGRAPH_PERSISTENT_CACHE=0: nothing saved.
    assert default["cache_files"] >= 1 and switched["cache_files"] == 0
    # BYTEGRAPH_REPLAY_RECORD=1: the frame the tracer failed on is recorded.
    assert default["replay_records"] == []
    assert switched["replay_records"] == ["replay_deliberately_failing_1.pt"]


def test_demo_runs_and_matches_eager():
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYTEGRAPH_")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "bytegraph.demo", "--runs", "3", "--no-graphs"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("result equals eager: yes") == 2, out.stdout
    assert out.stdout.count("graphs captured: 1") == 2, out.stdout
