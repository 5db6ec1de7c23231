"""``model.generate`` with a bytegraph-compiled forward: the same tokens as eager, few compiles.

Greedy decoding of 20 new tokens from a padded batch of two prompts, with the default
``DynamicCache`` and with the static cache. The prompt (8 tokens) and the first decoding
step (1 token, cache of 8) are compiled static; the next step's new cache length makes it
dynamic (automatic dynamic shapes), and every later step reuses that graph: three graphs
(as torch.compile makes for Llama: 3, and 2 with the static cache).
The static cache keeps its shapes, so prompt and steps take two. Skipped when transformers
is not installed.
"""
import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter

pytest.importorskip("transformers")

from bytegraph.demo.hf_models import build, inputs  # noqa: E402

CASES = [("llama", None, 3), ("llama", "static", 2), ("gpt2", None, 3), ("mistral", None, 3), ("bart", None, 3)]


@pytest.mark.parametrize("name,cache,graphs", CASES)
def test_generate_matches_eager(name, cache, graphs):
    model = build(name).eval()
    kw = inputs(name, batch=2, seq=8)
    kw.pop("decoder_input_ids", None)
    settings = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    if cache is not None:
        settings["cache_implementation"] = cache
    with torch.no_grad():
        expected = model.generate(**kw, **settings)
        cnt = CompileCounter()
        model.forward = bytegraph.compile(model.forward, backend=cnt)
        actual = model.generate(**kw, **settings)
    assert torch.equal(expected, actual)
    assert expected.shape[-1] >= 20
    assert cnt.frame_count == graphs, cnt.frame_count
