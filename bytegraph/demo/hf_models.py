"""Tiny HuggingFace ``transformers`` models built from small configs (random weights).

Nothing is downloaded: each model is made from a config with 2 layers and a 100-token
vocabulary. Used by the HF tests and ``bench/compare.py``; needs ``transformers``.
"""
import torch

VOCAB = 100
NAMES = ("gpt2", "bert", "llama", "t5")


def build(name, dropout=0.0, seed=0):
    """The model ``name`` (one of ``NAMES``), in training mode as transformers makes it."""
    import transformers as t   # optional (the test extra): imported only to build these models
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
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
    raise ValueError(f"unknown model {name!r}; known: {', '.join(NAMES)}")


def inputs(name, labels=False, batch=2, seq=16, seed=1):
    """Keyword arguments for one forward call (token ids; labels for a loss if asked)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    kw = {"input_ids": ids}
    if name == "t5":
        kw["decoder_input_ids"] = ids[:, :seq // 2].clone()
        if labels:
            kw["labels"] = ids[:, 1:seq // 2 + 1].clone()
    elif labels and name != "bert":
        kw["labels"] = ids.clone()
    return kw
