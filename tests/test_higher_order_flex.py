"""FlexAttention captured as torch's flex_attention operator: score and mask functions closing over
tensors, block masks made inside the compiled function or passed in, the log-sum-exp, grouped
query attention; values and gradients (of the tensors the functions read: FlexAttention has no
backward for q, k, v on the CPU) equal eager's."""
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import assert_traced
from test_higher_order import BACKENDS, check

B, H, S, D = 2, 4, 32, 16


def _qkv(heads_kv=H, seq=S):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, seq, D, generator=g)
    k = torch.randn(B, heads_kv, seq, D, generator=g)
    v = torch.randn(B, heads_kv, seq, D, generator=g)
    return q, k, v


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _flex_nodes(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.flex_attention]


@pytest.fixture(autouse=True)
def _quiet():
    # eager flex_attention warns that it is not compiled; not what these tests look at
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("backend", BACKENDS)
def test_score_mod_reading_a_tensor_with_gradient(backend):
    bias = torch.randn(S, requires_grad=True)

    def fn(q, k, v, bias):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s + bias[kv_idx])

    cnt = check(fn, *_qkv(), bias, backend=backend)
    (node,) = _flex_nodes(cnt.graphs[0])
    score_mod, score_buffers = node.args[3], node.args[7]
    assert score_mod.op == "get_attr" and len(score_buffers) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_alibi_and_soft_capping(backend):
    slopes = torch.linspace(0.1, 1.0, H, requires_grad=True)

    def fn(q, k, v, slopes):
        def score_mod(s, b, h, q_idx, kv_idx):
            s = 20.0 * torch.tanh(s / 20.0)
            return s + slopes[h] * (kv_idx - q_idx)
        return flex_attention(q, k, v, score_mod=score_mod)

    check(fn, *_qkv(), slopes, backend=backend, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_mask_made_inside_with_document_mask(backend):
    doc = torch.tensor([0] * 10 + [1] * 12 + [2] * 10)

    def fn(q, k, v, doc):
        def mask(b, h, q_idx, kv_idx):
            return causal(b, h, q_idx, kv_idx) & (doc[q_idx] == doc[kv_idx])
        block_mask = create_block_mask(mask, None, None, S, S, device="cpu", BLOCK_SIZE=8)
        return flex_attention(q, k, v, block_mask=block_mask)

    cnt = check(fn, *_qkv(), doc, backend=backend, grads=False)
    (node,) = _flex_nodes(cnt.graphs[0])
    assert node.args[4][-1].op == "get_attr"       # the mask function, last in the block mask tuple
    assert len(node.args[8]) == 1                  # doc, read by the mask function


def test_block_mask_passed_in():
    block_mask = create_block_mask(causal, B, None, S, S, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=block_mask)

    check(fn, *_qkv(), grads=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_lse_and_gqa(backend):
    window = 6

    def fn(q, k, v):
        def sliding(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
        block_mask = create_block_mask(sliding, None, None, S, S, device="cpu", BLOCK_SIZE=8)
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)      # return_lse's deprecation
        check(fn, *_qkv(heads_kv=2), backend=backend, grads=False)


def test_defaults_one_graph():
    def fn(q, k, v):
        return flex_attention(q, k, v) * 2

    cnt = check(fn, *_qkv(), grads=False)
    assert len(_flex_nodes(cnt.graphs[0])) == 1


def test_untraceable_score_mod_breaks():
    def fn(q, k, v):
        def score_mod(s, b, h, q_idx, kv_idx):
            return s + q_idx.item()
        return flex_attention(q, k, v, score_mod=score_mod)

    with pytest.raises(bytegraph.errors.Unsupported):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(*_qkv())


def test_backward_of_qkv_refused_on_cpu_as_eager():
    def fn(q, k, v):
        return flex_attention(q, k, v)

    q, k, v = _qkv()
    q.requires_grad_()
    with pytest.raises(NotImplementedError):
        fn(q, k, v)
    bytegraph.reset()
    with pytest.raises(NotImplementedError):
        bytegraph.compile(fn, backend="eager")(q, k, v)
    assert_traced()     # the call was traced and raises from the graph break, as eager does


def test_hf_llama_with_flex_attention_is_one_graph():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "flex_attention"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 16))
    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(model, backend=cnt, fullgraph=True)
    other_ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        expected = model(ids).logits
        actual = compiled(ids).logits
        expected_again = model(other_ids).logits
        again = compiled(other_ids).logits
    assert torch.allclose(expected, actual, atol=1e-5)
    assert torch.allclose(expected_again, again, atol=1e-5)
    assert cnt.frame_count == 1
    assert len(_flex_nodes(cnt.graphs[0])) == 2      # one per layer


_compiled_flex = torch.compile(flex_attention)       # made once, as model code often does


def test_torch_compiled_flex_attention_called_inside():
    def fn(q, k, v):
        return _compiled_flex(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s * 0.5)

    cnt = check(fn, *_qkv(), grads=False)
    assert len(_flex_nodes(cnt.graphs[0])) == 1


def test_torch_compile_called_inside():
    def fn(q, k, v):
        block_mask = torch.compile(create_block_mask)(causal, None, None, S, S, device="cpu")
        return flex_attention(q, k, v, block_mask=block_mask)

    check(fn, *_qkv(), grads=False)


def test_block_mask_made_inside_with_dynamic_sizes():
    # The sequence length is symbolic: create_block_mask pads the mask to whole blocks with a
    # symbolic amount (F.pad's kernel takes only concrete sizes; its decomposition takes these).
    from helpers import torch_compile_graphs

    def fn(q, k, v):
        def document_causal(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx // 12 == kv_idx // 12)
        seq = q.shape[2]
        block_mask = create_block_mask(document_causal, None, None, seq, seq, device="cpu", BLOCK_SIZE=8)
        return flex_attention(q, k, v, block_mask=block_mask)

    calls = [_qkv(seq=n) for n in (32, 44, 64)]
    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(fn, backend=cnt, dynamic=True, fullgraph=True)
    for q, k, v in calls:
        assert torch.allclose(compiled(q, k, v), fn(q, k, v), atol=1e-5)
    assert cnt.frame_count == 1 == torch_compile_graphs(fn, *calls, dynamic=True)
    assert len(_flex_nodes(cnt.graphs[0])) == 1
