"""HuggingFace transformers models (tiny configs, random weights): one graph, equal to eager.

Each model is built from a small config (nothing is downloaded). With ``fullgraph=True``
the forward must compile to exactly one graph, return the same ``ModelOutput`` type
and fields as eager (``bytegraph.testing.same``: type, keys, allclose), and hit the
cache on the second call. A training step through ``aot_eager`` (dropout off, so the
step is deterministic) must give the loss and every parameter gradient of eager.
Skipped when transformers is not installed.
"""
import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter, same

transformers = pytest.importorskip("transformers")

VOCAB = 100


def build(name, dropout=0.0):
    torch.manual_seed(0)
    t = transformers
    if name == "gpt2":
        cfg = t.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64,
                           resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                           bos_token_id=0, eos_token_id=0)
        return t.GPT2LMHeadModel(cfg)
    if name == "bert":
        cfg = t.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                           vocab_size=VOCAB, max_position_embeddings=64,
                           hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        return t.BertModel(cfg)
    if name == "llama":
        cfg = t.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, hidden_size=32,
                            intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
                            attention_dropout=dropout)
        return t.LlamaForCausalLM(cfg)
    if name == "t5":
        cfg = t.T5Config(num_layers=2, num_decoder_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64,
                         vocab_size=VOCAB, dropout_rate=dropout)
        return t.T5ForConditionalGeneration(cfg)
    raise ValueError(name)


def inputs(name, labels=False):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    kw = {"input_ids": ids}
    if name == "t5":
        kw["decoder_input_ids"] = ids[:, :8].clone()
        if labels:
            kw["labels"] = ids[:, 1:9].clone()
    elif labels and name != "bert":
        kw["labels"] = ids.clone()
    return kw


# Sequence.__iter__ (the per-layer config view) ends on IndexError: needs exceptions in the trace.
_NEEDS_EXCEPTIONS = pytest.mark.xfail(raises=bytegraph.Unsupported, strict=True,
                                      reason="Sequence.__iter__ ends on IndexError (exceptions in the trace)")
MODELS = ["bert"] + [pytest.param(n, marks=_NEEDS_EXCEPTIONS) for n in ("gpt2", "llama", "t5")]


@pytest.mark.parametrize("name", MODELS)
def test_forward_is_one_graph(name):
    model = build(name).eval()
    kw = inputs(name)
    expected = model(**kw)
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt, fullgraph=True)
    actual = compiled(**kw)
    assert type(actual) is type(expected)
    assert list(actual.keys()) == list(expected.keys())
    assert same(expected, actual, rtol=1e-4, atol=1e-5)
    again = compiled(**inputs(name))
    assert same(expected, again, rtol=1e-4, atol=1e-5)
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"


def _loss(name, out):
    if name == "bert":
        return out.last_hidden_state.pow(2).mean() + out.pooler_output.sum()
    return out.loss


@pytest.mark.parametrize("name", MODELS)
def test_training_step_aot_eager(name):
    eager_model = build(name).train()
    compiled_model = build(name).train()
    compiled = bytegraph.compile(compiled_model, backend="aot_eager", fullgraph=True)
    kw = inputs(name, labels=True)

    eager_loss = _loss(name, eager_model(**kw))
    eager_loss.backward()
    loss = _loss(name, compiled(**kw))
    loss.backward()

    assert torch.allclose(eager_loss, loss, rtol=1e-4, atol=1e-5), (eager_loss, loss)
    eager_params = dict(eager_model.named_parameters())
    for pname, p in compiled_model.named_parameters():
        ref = eager_params[pname].grad
        if ref is None:
            assert p.grad is None, pname
            continue
        assert p.grad is not None, f"no gradient for {pname}"
        assert torch.allclose(ref, p.grad, rtol=1e-3, atol=1e-5), pname
