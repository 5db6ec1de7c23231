"""Tiny HuggingFace ``transformers`` models built from small configs (random weights).

Nothing is downloaded: each model is made from a config with 1-2 layers, hidden size 32
and a 100-token vocabulary. ``ZOO`` lists one model per architecture family (decoder
LMs, mixture of experts, state space, encoders, encoder-decoders, vision, multimodal,
audio); ``build(name)`` makes one, ``inputs(name, labels=...)`` its keyword arguments
(masks, labels, ``use_cache`` where the model takes them). Used by the HF tests,
``bench/compare.py`` and ``bench/hf_models.py``; needs ``transformers``.
"""
import torch

VOCAB = 100

# name -> (config class, model class, config keyword arguments, input kind)
_D = dict(vocab_size=VOCAB)
_LLAMA_LIKE = dict(_D, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                   intermediate_size=64, max_position_embeddings=64)
_BART_LIKE = dict(_D, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
_BERT_LIKE = dict(_D, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                  max_position_embeddings=64)

ZOO = {
    # decoder LMs
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(_D, n_layer=2, n_head=2, n_embd=32, n_positions=64, bos_token_id=0, eos_token_id=0), "causal"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(_D, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                      max_position_embeddings=64), "causal"),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(_D, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, ffn_dim=64,
                 word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=1), "causal"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=4), "causal"),
    "mistral": ("MistralConfig", "MistralForCausalLM", _LLAMA_LIKE, "causal"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA_LIKE, "causal"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA_LIKE, head_dim=8, sliding_window=8), "causal"),
    "phi": ("PhiConfig", "PhiForCausalLM",
            dict(_D, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                 max_position_embeddings=64), "causal"),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(_D, num_hidden_layers=2, num_attention_heads=2, hidden_size=32), "causal"),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(_D, n_layer=2, n_head=2, hidden_size=32), "causal"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(_D, n_layer=2, n_head=2, n_embd=32, n_positions=64, rotary_dim=8, bos_token_id=0,
                  eos_token_id=0), "causal"),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                dict(_D, n_layer=2, n_head=2, n_embd=32, n_positions=64, n_ctx=64, rotary_dim=8, bos_token_id=0,
                     eos_token_id=0), "causal"),
    # mixture of experts
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2), "causal"),
    # state space
    "mamba": ("MambaConfig", "MambaForCausalLM",
              dict(_D, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4), "causal"),
    # encoders
    "bert": ("BertConfig", "BertForMaskedLM", _BERT_LIKE, "encoder"),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(_BERT_LIKE, max_position_embeddings=80), "encoder"),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM",
                   dict(_D, n_layers=2, n_heads=2, dim=32, hidden_dim=64, max_position_embeddings=64), "encoder"),
    "albert": ("AlbertConfig", "AlbertForMaskedLM", dict(_BERT_LIKE, embedding_size=16), "encoder"),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM",
                   dict(_BERT_LIKE, relative_attention=True, position_buckets=8, max_relative_positions=16,
                        pos_att_type=["p2c", "c2p"]), "encoder"),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", dict(_BERT_LIKE, embedding_size=32), "encoder"),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM",
                   dict(_BERT_LIKE, global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2), "encoder"),
    # encoder-decoders
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(_D, num_layers=2, num_decoder_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64), "seq2seq"),
    "bart": ("BartConfig", "BartForConditionalGeneration", _BART_LIKE, "seq2seq"),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", dict(_BART_LIKE, pad_token_id=0,
                                                                          decoder_start_token_id=0), "seq2seq"),
    "marian": ("MarianConfig", "MarianMTModel", dict(_BART_LIKE, pad_token_id=VOCAB - 1,
                                                      decoder_start_token_id=VOCAB - 1), "seq2seq"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration",
                dict(_BART_LIKE, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
                     pad_token_id=VOCAB - 1, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 2,
                     decoder_start_token_id=VOCAB - 3, suppress_tokens=None, begin_suppress_tokens=None),
                "speech2seq"),
    # vision
    "vit": ("ViTConfig", "ViTForImageClassification",
            dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                 image_size=32, patch_size=8, num_labels=5), "vision"),
    "swin": ("SwinConfig", "SwinForImageClassification",
             dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                  num_labels=5), "vision"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification",
                 dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, image_size=32), "vision"),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation",
                  dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                       num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                       decoder_hidden_size=16, num_labels=5), "segmentation"),
    # multimodal
    "clip": ("CLIPConfig", "CLIPModel",
             dict(text_config=dict(_BERT_LIKE, max_position_embeddings=16, projection_dim=16, bos_token_id=0,
                                   eos_token_id=2, pad_token_id=1),
                  vision_config=dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                     intermediate_size=64, image_size=32, patch_size=8, projection_dim=16),
                  projection_dim=16), "clip"),
    # audio
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForCTC",
                 dict(_BERT_LIKE, vocab_size=20, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, pad_token_id=0,
                      ctc_loss_reduction="mean"), "audio"),
}

# Architectures whose code breaks the graph (data-dependent steps, custom autograd Functions):
# both compilers split them into many graphs; tests/test_capture_after_break.py checks that
# bytegraph keeps compiling after each break (ops in graphs against torch.compile's).
BREAKING = {
    # `.item()` in the encoder, `nonzero` for the global-attention indices (global_attention_mask)
    "longformer": ("LongformerConfig", "LongformerForMaskedLM",
                   dict(_BERT_LIKE, attention_window=4, max_position_embeddings=80, pad_token_id=1), "longformer"),
    # `.item()` in the axial position embeddings, a reversible autograd Function over a ModuleList,
    # torch.manual_seed before hashing (hash_seed makes LSH attention deterministic)
    "reformer": ("ReformerConfig", "ReformerModelWithLMHead",
                 dict(_D, hidden_size=32, num_attention_heads=2, attention_head_size=16, feed_forward_size=64,
                      axial_pos_shape=(4, 4), axial_pos_embds_dim=(16, 16), attn_layers=["local", "lsh"],
                      local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2,
                      max_position_embeddings=16, is_decoder=True, pad_token_id=0, eos_token_id=2, hash_seed=0),
                 "reformer"),
}
NAMES = tuple(ZOO)
BREAKING_NAMES = tuple(BREAKING)
# Dropout arguments of the configs above (whichever a config has are set).
_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
             "attention_dropout", "dropout", "dropout_rate", "hidden_dropout", "activation_dropout",
             "classifier_dropout", "embedding_dropout", "mlp_dropout", "qa_dropout", "seq_classif_dropout",
             "summary_first_dropout", "hidden_dropout_prob", "classifier_dropout_prob", "attention_probs_dropout",
             "feat_proj_dropout", "final_dropout", "layerdrop", "encoder_layerdrop", "decoder_layerdrop",
             "drop_path_rate", "mask_time_prob", "attn_dropout", "resid_dropout", "embed_dropout", "ffn_dropout",
             "emb_dropout", "local_attention_probs_dropout_prob", "lsh_attention_probs_dropout_prob")


def build(name, dropout=0.0, seed=0):
    """The model ``name`` (one of ``NAMES``), in training mode as transformers makes it."""
    import transformers as t   # optional (the test extra): imported only to build these models
    spec = _spec(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(NAMES + BREAKING_NAMES)}")
    cfg_name, model_name, kwargs, _ = spec
    cfg = getattr(t, cfg_name)(**kwargs)
    for attr in _DROPOUTS:
        if hasattr(cfg, attr) and isinstance(getattr(cfg, attr), (int, float)) \
                and not isinstance(getattr(cfg, attr), bool):
            setattr(cfg, attr, dropout if attr not in ("mask_time_prob", "layerdrop", "encoder_layerdrop",
                                                      "decoder_layerdrop", "drop_path_rate") else 0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(t, model_name)(cfg)


def kind(name):
    """What inputs the model takes: causal, encoder, seq2seq, speech2seq, vision, segmentation, clip, audio
    (longformer, reformer: those of an encoder / a decoder, and their own)."""
    return _spec(name)[3]


def _spec(name):
    # Looked up at each call: tests change ZOO's entries (deeper configs).
    return ZOO.get(name) or BREAKING.get(name)


def inputs(name, labels=False, batch=2, seq=16, seed=1, use_cache=None, mask=True):
    """Keyword arguments for one forward call: token ids (or pixels, features, audio), an
    attention mask with padding in the second row where the model takes one, labels for a
    loss if asked, ``use_cache`` if given."""
    g = torch.Generator().manual_seed(seed)
    k = kind(name)
    kw = {}
    own = None
    if k == "longformer":
        k, own = "encoder", k
    elif k == "reformer":
        k, own = "causal", k

    def ids(n):
        return torch.randint(3, VOCAB - 3, (batch, n), generator=g)

    def padded_mask(n):
        m = torch.ones(batch, n, dtype=torch.long)
        if batch > 1:
            m[1, : n // 4] = 0 if k == "causal" else 1   # left padding for decoders
            m[1, n - n // 4:] = 1 if k == "causal" else 0   # right padding for encoders
        return m

    if k in ("causal", "encoder", "seq2seq", "clip"):
        kw["input_ids"] = ids(seq)
        if mask and name != "mamba":
            kw["attention_mask"] = padded_mask(seq)
    if k == "seq2seq":
        kw["decoder_input_ids"] = ids(seq // 2)
        if labels:
            kw["labels"] = ids(seq // 2)
    elif k == "speech2seq":
        kw["input_features"] = torch.randn(batch, 8, 32, generator=g)
        kw["decoder_input_ids"] = ids(seq // 2)
        if labels:
            kw["labels"] = ids(seq // 2)
    elif k in ("vision", "segmentation", "clip"):
        kw["pixel_values"] = torch.randn(batch, 3, 32, 32, generator=g)
        if labels and k == "vision":
            kw["labels"] = torch.randint(0, 5, (batch,), generator=g)
        if labels and k == "segmentation":
            kw["labels"] = torch.randint(0, 5, (batch, 32, 32), generator=g)
        if labels and k == "clip":
            kw["return_loss"] = True
    elif k == "audio":
        kw["input_values"] = torch.randn(batch, 400, generator=g)
        if labels:
            kw["labels"] = torch.randint(1, 20, (batch, 6), generator=g)
    elif labels and k == "causal":
        kw["labels"] = kw["input_ids"].clone()
    elif labels and k == "encoder":
        lab = kw["input_ids"].clone()
        lab[:, ::2] = -100
        kw["labels"] = lab
    if use_cache is not None and k in ("causal", "seq2seq", "speech2seq"):
        kw["use_cache"] = use_cache
    if own == "longformer":
        # Global attention on the first token: the path with `nonzero` and data-dependent sizes.
        kw["global_attention_mask"] = torch.zeros_like(kw["input_ids"])
        kw["global_attention_mask"][:, 0] = 1
    return kw


def loss_of(out):
    """A scalar to differentiate: the model's loss, or the sum of its main output when it has none."""
    loss = out.get("loss") if hasattr(out, "get") else None
    if loss is not None:
        return loss
    first = out[0] if not isinstance(out, torch.Tensor) else out
    return first.float().pow(2).mean()
