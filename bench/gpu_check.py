"""The inductor-on-GPU path: compile the demo models with backend="inductor" on CUDA.

Checks results against eager (forward, and a training step's gradients) and
times eager vs compiled per call. Run on a machine with a GPU:
    python bench/gpu_check.py
"""
import copy
import sys
import time

import torch

sys.path.insert(0, ".")
import bytegraph  # noqa: E402
from bytegraph.demo.models import MLP, GPTConfig, TinyGPT  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


def timed(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    assert torch.cuda.is_available(), "needs a GPU"
    dev = "cuda"
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {torch.cuda.get_device_name()}")
    cases = [
        ("mlp", MLP().to(dev), (torch.randn(256, 64, device=dev),)),
        ("tinygpt", TinyGPT(GPTConfig(n_layer=4, n_embd=256, n_head=8, vocab_size=1024, block_size=128)).to(dev),
         (torch.randint(0, 1024, (8, 128), device=dev),)),
    ]
    for name, model, inputs in cases:
        model.eval()
        t0 = time.perf_counter()
        compiled = bytegraph.compile(model, backend="inductor")
        with torch.no_grad():
            out_c = compiled(*inputs)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            out_e = model(*inputs)
            ok = torch.allclose(out_e, out_c, rtol=1e-2, atol=1e-2)
            te = timed(lambda: model(*inputs))
            tc = timed(lambda: compiled(*inputs))
        # one training step
        m2 = copy.deepcopy(model)
        c2 = bytegraph.compile(m2, backend="inductor")
        model.zero_grad()
        model(*inputs).float().pow(2).mean().backward()
        c2(*inputs).float().pow(2).mean().backward()
        gok = all(torch.allclose(p.grad, q.grad, rtol=1e-2, atol=1e-3)
                  for p, q in zip(model.parameters(), m2.parameters()))
        print(f"{name:8s} forward equal={ok} grads equal={gok} first call {first:.1f}s "
              f"eager {te:.0f}us compiled {tc:.0f}us speedup {te / tc:.2f}x")

    hf_models_on_gpu(dev)


def hf_models_on_gpu(dev):
    """The tiny transformers models through inductor on the GPU (when transformers is installed)."""
    try:
        from bytegraph.demo import hf_models
    except ImportError:
        return
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        print("transformers not installed: HF models skipped")
        return
    from bytegraph.testing import same
    for name in ("gpt2", "bert", "llama", "t5"):   # the whole zoo: bench/hf_models.py
        model = hf_models.build(name).to(dev).eval()
        kw = {k: v.to(dev) for k, v in hf_models.inputs(name, batch=8, seq=64).items()}
        t0 = time.perf_counter()
        compiled = bytegraph.compile(model, backend="inductor", fullgraph=True)
        with torch.no_grad():
            out_c = compiled(**kw)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            out_e = model(**kw)
            ok = same(out_e, out_c, rtol=1e-2, atol=1e-2)
            te = timed(lambda: model(**kw))
            tc = timed(lambda: compiled(**kw))
        print(f"hf_{name:6s} fullgraph forward equal={ok} first call {first:.1f}s "
              f"eager {te:.0f}us compiled {tc:.0f}us speedup {te / tc:.2f}x")


if __name__ == "__main__":
    main()
