"""Code written for torch.compile runs on bytegraph unchanged (``bytegraph.patch_torch_compile``).

``torch.compile`` and ``nn.Module.compile`` compile with bytegraph (same arguments) while
patched, and are torch's own again after ``unpatch_torch_compile``; the environment
variable ``BYTEGRAPH_PATCH_TORCH_COMPILE=1`` patches at ``import bytegraph`` and
``python -m bytegraph script.py`` runs a script patched. HF ``Trainer(torch_compile=True)``
trains a tiny model for a few steps with the losses of eager training.
"""
import os
import subprocess
import sys

import pytest
import torch

import bytegraph
from bytegraph.debug import records
from bytegraph.testing import CompileCounter, same

ORIGINAL_COMPILE = torch.compile
ORIGINAL_MODULE_COMPILE = torch.nn.Module.compile


@pytest.fixture
def patched():
    bytegraph.patch_torch_compile()
    try:
        yield
    finally:
        bytegraph.unpatch_torch_compile()
    assert torch.compile is ORIGINAL_COMPILE and torch.nn.Module.compile is ORIGINAL_MODULE_COMPILE


def _fn(x, y):
    return (x.sin() + y).relu().sum(-1)


def test_torch_compile_uses_bytegraph_with_its_arguments(patched):
    cnt = CompileCounter()
    compiled = torch.compile(_fn, backend=cnt, fullgraph=True, dynamic=False, name="ignored")
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    assert same(compiled(x, y), _fn(x, y))
    assert cnt.frame_count == 1
    # The decorator form, too.
    deco = torch.compile(backend=cnt)(_fn)
    assert same(deco(x, y), _fn(x, y))
    # Each compile keeps its own entries in bytegraph: isolate_recompiles=True is what it always does.
    isolated = torch.compile(_fn, backend=cnt, isolate_recompiles=True)
    assert same(isolated(x, y), _fn(x, y))
    with pytest.raises(bytegraph.BytegraphError, match="shapes_spec"):
        torch.compile(_fn, shapes_spec={"x": None})


def test_module_compile_uses_bytegraph(patched):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    x = torch.randn(4, 3)
    expected = model(x)
    cnt = CompileCounter()
    model.compile(backend=cnt, fullgraph=True)
    assert same(model(x), expected)
    assert same(model(x), expected)
    assert cnt.frame_count == 1
    assert isinstance(torch.compile(model, backend=cnt), bytegraph.OptimizedModule)


def test_unpatched_torch_compile_is_torch_own():
    bytegraph.patch_torch_compile()
    bytegraph.patch_torch_compile()   # twice is once
    bytegraph.unpatch_torch_compile()
    bytegraph.unpatch_torch_compile()
    assert torch.compile is ORIGINAL_COMPILE and torch.nn.Module.compile is ORIGINAL_MODULE_COMPILE


_SCRIPT = """
import sys, torch
import bytegraph.api
def f(x):
    return x.cos() * 2
out = torch.compile(f, backend="eager")(torch.ones(3))
print("patched" if torch.compile is bytegraph.api._torch_compile_on_bytegraph else "not patched",
      out.tolist(), sys.argv[1:])
"""


def test_python_m_bytegraph_runs_a_script_patched(tmp_path, capsys):
    from bytegraph.__main__ import main
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    argv = list(sys.argv)
    try:
        assert main([str(script), "--epochs", "1"]) == 0
    finally:
        sys.argv = argv
        bytegraph.unpatch_torch_compile()
    out = capsys.readouterr().out
    assert f"patched {[2 * torch.ones(1).cos().item()] * 3} ['--epochs', '1']" in out


def test_environment_variable_patches_at_import(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import bytegraph\n" + _SCRIPT)
    env = dict(os.environ, BYTEGRAPH_PATCH_TORCH_COMPILE="1", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("patched"), out.stdout


def _train(tmp_path, compile_it):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="HF Trainer needs accelerate")
    from bytegraph.demo.hf_models import build, inputs
    model = build("gpt2")
    rows = []
    for i in range(6):
        ids = inputs("gpt2", batch=1, seq=16, seed=10 + i)["input_ids"][0]
        rows.append({"input_ids": ids, "labels": ids.clone()})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("compiled" if compile_it else "eager")), max_steps=3,
        per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, data_seed=0, torch_compile=compile_it,
        torch_compile_backend="aot_eager" if compile_it else None, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_hf_trainer_torch_compile_trains_like_eager(patched, tmp_path):
    eager = _train(tmp_path, compile_it=False)
    bytegraph.reset()
    start = len(records.frames)
    compiled = _train(tmp_path, compile_it=True)
    assert len(records.frames) > start, "the Trainer's torch.compile did not reach bytegraph"
    assert len(eager) == len(compiled) == 3
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-5)
