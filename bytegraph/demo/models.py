"""Small hand-written models used by the demo and the benchmarks.

Everything here is ordinary PyTorch model code, written the way people write
it: loops over ``nn.ModuleList``, ``x.size()`` unpacking, ``if`` on config
flags, dropout layers (inactive in eval mode), registered buffers. That is
deliberate: these models exist to exercise a JIT front end on realistic code,
so they should not be simplified for the compiler's sake.

Models:

* ``MLP``: three ``nn.Linear`` layers with ReLU between them.
* ``TinyGPT``: a nanoGPT-style decoder-only transformer, configured by
  ``GPTConfig`` (default: 2 layers, 64-dim embeddings, 4 heads, vocabulary
  of 128, context of 32 tokens).

``make_model(name)`` and ``make_inputs(name)`` build a model (in eval mode,
with a fixed seed) and a tuple of example inputs for it.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLP", "GPTConfig", "CausalSelfAttention", "FeedForward", "Block", "TinyGPT",
           "MODELS", "make_model", "make_inputs"]


class MLP(nn.Module):
    """Three Linear layers with ReLU in between: ``in -> hidden -> hidden -> out``."""

    def __init__(self, in_features=64, hidden=128, out_features=10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_features)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@dataclass
class GPTConfig:
    """Shape and options of a ``TinyGPT``."""

    block_size: int = 32      # longest sequence the model accepts
    vocab_size: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.1      # only active in training mode
    bias: bool = True         # bias in Linear layers and LayerNorms
    flash: bool = False       # use F.scaled_dot_product_attention instead of the hand-written softmax


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, q/k/v produced by one Linear."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be a multiple of n_head"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = config.flash
        if not self.flash:
            # Lower-triangular mask: position t may attend to positions <= t.
            mask = torch.tril(torch.ones(config.block_size, config.block_size))
            self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()  # batch, sequence length, embedding width
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        head_dim = C // self.n_head
        q = q.view(B, T, self.n_head, head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.n_head, head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, head_dim).transpose(1, 2)

        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None,
                dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class FeedForward(nn.Module):
    """The transformer block's MLP: widen 4x, GELU, project back."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = FeedForward(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TinyGPT(nn.Module):
    """A small nanoGPT-style decoder: token ids ``(B, T)`` in, logits ``(B, T, vocab)`` out."""

    def __init__(self, config=None):
        super().__init__()
        config = config if config is not None else GPTConfig()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)   # token embedding
        self.wpe = nn.Embedding(config.block_size, config.n_embd)   # position embedding
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2

    def forward(self, idx):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return self.lm_head(x)


# name -> (constructor, input maker). The input makers take the model so they
# can read its configuration.
def _mlp_inputs(model, batch=8):
    return (torch.randn(batch, model.fc1.in_features),)


def _gpt_inputs(model, batch=2):
    cfg = model.config
    return (torch.randint(0, cfg.vocab_size, (batch, cfg.block_size)),)


MODELS = {
    "mlp": (MLP, _mlp_inputs),
    "tinygpt": (TinyGPT, _gpt_inputs),
    "tinygpt_sdpa": (lambda: TinyGPT(GPTConfig(flash=True)), _gpt_inputs),
}


def make_model(name, seed=0):
    """A fresh model called ``name`` (see ``MODELS``), deterministic weights, eval mode."""
    try:
        ctor, _ = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    torch.manual_seed(seed)
    return ctor().eval()


def make_inputs(name, model=None, seed=1):
    """A tuple of example inputs for model ``name`` (built with a fixed seed)."""
    if model is None:
        model = make_model(name)
    _, inputs = MODELS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return inputs(model)
