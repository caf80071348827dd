"""The course's models and data: a small GPT, a tiny MLP, and synthetic data (lesson 01 on).

Plain single-process PyTorch: nothing here knows about ranks. Every parallel strategy in
`dlcourse.parallel` takes one of these models and a process group and makes it parallel.

The GPT is GPT-2's architecture (pre-LayerNorm blocks, learned positions, GELU MLP, tied
embedding and output weights) with attention written out step by step, so each tensor that
Korthikanti et al. (2022) count in activation memory exists here under its own name.
`MoEGPT` (lesson 09) is the same GPT with mixture-of-experts MLPs from `dlcourse/moe.py`.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.moe import MoE


@dataclass
class GPTConfig:
    vocab_size: int = 128  # V: token ids 0..V-1
    seq_len: int = 32  # T (s in the papers): tokens per sequence, the context length
    n_layers: int = 2  # L: transformer blocks
    n_heads: int = 4  # a: attention heads; must divide hidden
    hidden: int = 64  # h: the width of the residual stream
    dropout: float = 0.0  # after attention probs, attention output and MLP output; 0 = off
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2
    tie_embeddings: bool = True  # the output layer reuses the token embedding matrix

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_layers", "n_heads", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a whole number >= 1, got {value!r}")
        if self.hidden % self.n_heads:
            raise ValueError(
                f"GPTConfig: n_heads {self.n_heads} does not divide hidden {self.hidden} "
                f"({self.hidden} / {self.n_heads} = {self.hidden / self.n_heads:g}); "
                "every head needs hidden / n_heads dimensions"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout is a probability in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self):
        return self.hidden // self.n_heads


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=config.bias)
        self.proj = nn.Linear(config.hidden, config.hidden, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        causal = torch.tril(torch.ones(config.seq_len, config.seq_len, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)  # (T, T), True = may attend

    def forward(self, x):
        B, T, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)  # each (B, T, h)
        q, k, v = (t.view(B, T, self.n_heads, h // self.n_heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, a, T, T)
        scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        probs = self.attn_dropout(F.softmax(scores, dim=-1))  # (B, a, T, T)
        y = (probs @ v).transpose(1, 2).reshape(B, T, h)  # heads side by side again
        return self.resid_dropout(self.proj(y))


class MLPBlock(nn.Module):
    """The transformer's feed-forward part: h -> 4h -> GELU -> h."""

    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.hidden, 4 * config.hidden, bias=config.bias)
        self.proj = nn.Linear(4 * config.hidden, config.hidden, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden, bias=config.bias)
        self.mlp = MLPBlock(config)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT(config, seed) -> a model whose forward maps token ids (B, T) to logits (B, T, V).

    The same config and seed give the same weights on every process, whatever the global RNG.
    """

    def __init__(self, config, seed=0):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden)
        self.pos_emb = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.hidden, bias=config.bias)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one (V, h) matrix, used twice
        init_weights(self, seed, residual_layers=2 * config.n_layers)

    def forward(self, idx):
        B, T = idx.shape
        if T > self.config.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len {self.config.seq_len}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))  # (B, T, h)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def lm_loss(logits, targets):
    """Mean cross-entropy of next-token prediction over every position: (B, T, V), (B, T) -> ()."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass
class MoEConfig(GPTConfig):
    """The course GPT with mixture-of-experts MLPs (lesson 09, `dlcourse/moe.py`)."""

    n_experts: int = 4  # E: expert MLPs in each MoE block
    top_k: int = 2  # k: experts each token is sent to
    capacity_factor: float | None = None  # None: dropless; else expert capacity, see moe.py
    moe_every: int = 1  # block i is MoE when (i + 1) % moe_every == 0: 1 all, 2 every other
    expert_hidden: int = 0  # f: each expert's inner width; 0 means 4h, the dense MLP's
    aux_loss_coef: float = 0.01  # alpha: weight of the load-balance loss (Switch's 1e-2)
    n_shared_experts: int = 0  # DeepSeekMoE's shared experts: every token, weight 1 (0: none)
    score_func: str = "softmax"  # router scores: "softmax" (Switch, Mixtral), "sigmoid" (DS-V3)
    z_loss_coef: float = 0.0  # weight of ST-MoE's router z-loss (HF's Switch: 1e-3; 0: off)

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.n_shared_experts, bool) or not isinstance(self.n_shared_experts, int) \
                or self.n_shared_experts < 0:
            raise ValueError(f"MoEConfig.n_shared_experts must be a whole number >= 0, got "
                             f"{self.n_shared_experts!r}")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"MoEConfig.score_func must be 'softmax' or 'sigmoid', got "
                             f"{self.score_func!r}")
        if not self.z_loss_coef >= 0:
            raise ValueError(f"MoEConfig.z_loss_coef must be >= 0, got {self.z_loss_coef!r}")
        for name in ("n_experts", "top_k", "moe_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoEConfig.{name} must be a whole number >= 1, got {value!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoEConfig: top_k {self.top_k} > n_experts {self.n_experts}: a "
                             f"token cannot go to {self.top_k} different experts out of "
                             f"{self.n_experts}; use top_k <= {self.n_experts}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"MoEConfig.capacity_factor must be > 0 (or None for dropless), got "
                             f"{self.capacity_factor!r}: an expert with capacity "
                             f"ceil({self.capacity_factor!r} * k * N / E) takes no tokens")
        if isinstance(self.expert_hidden, bool) or not isinstance(self.expert_hidden, int) \
                or self.expert_hidden < 0:
            raise ValueError(f"MoEConfig.expert_hidden must be a whole number >= 0 (0: 4h), got "
                             f"{self.expert_hidden!r}")

    @property
    def ffn_hidden(self):
        return self.expert_hidden or 4 * self.hidden

    @property
    def moe_blocks(self):
        """Indices of the blocks whose MLP is an MoE."""
        return [i for i in range(self.n_layers) if (i + 1) % self.moe_every == 0]


class MoEGPT(GPT):
    """The course GPT with an `MoE` in place of the MLP of `config.moe_blocks`. After a forward,
    `aux_loss()` is the sum over MoE blocks of their load-balance losses (one term per MoE
    layer, each weighted by alpha); train on `moe_loss(model, logits, targets)`. Same config
    and seed, same weights."""

    def __init__(self, config, seed=0):
        super().__init__(config, seed)
        for i in config.moe_blocks:
            self.blocks[i].mlp = MoE(config)
        init_weights(self, seed, residual_layers=2 * config.n_layers)  # again, with the experts

    def moe_layers(self):
        return [self.blocks[i].mlp for i in self.config.moe_blocks]

    def aux_loss(self):
        return sum(moe.aux_loss for moe in self.moe_layers())

    def z_loss(self):
        return sum(moe.z_loss for moe in self.moe_layers())


def moe_loss(model, logits, targets):
    """lm_loss + alpha · the load-balance losses (+ z_loss_coef · the router z-losses, when on)
    of the forward that made `logits`."""
    loss = lm_loss(logits, targets) + model.config.aux_loss_coef * model.aux_loss()
    if model.config.z_loss_coef:
        loss = loss + model.config.z_loss_coef * model.z_loss()
    return loss


@dataclass
class MLPConfig:
    d_in: int = 16  # input features
    hidden: int = 64  # width of every hidden layer
    n_layers: int = 2  # hidden layers (Linear + GELU each)
    d_out: int = 16  # outputs

    def __post_init__(self):
        for name in ("d_in", "hidden", "n_layers", "d_out"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MLPConfig.{name} must be a whole number >= 1, got {value!r}")


class MLP(nn.Sequential):
    """A tiny MLP for quick demos: (B, d_in) -> (B, d_out). Same seed, same weights."""

    def __init__(self, config, seed=0):
        widths = [config.d_in] + [config.hidden] * config.n_layers
        layers = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.GELU()]
        super().__init__(*layers, nn.Linear(widths[-1], config.d_out))
        self.config = config
        init_weights(self, seed, residual_layers=0)


def init_weights(model, seed, residual_layers):
    """GPT-2's initialisation from a private generator: N(0, 0.02) weights, zero biases, unit
    LayerNorm scales; output projections of residual branches scaled by 1/sqrt(residual_layers)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # a tied weight is listed (and drawn) once
        with torch.no_grad():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm scale
                p.fill_(1.0)
            else:
                std = 0.02
                if residual_layers and name.endswith("proj.weight"):
                    std /= math.sqrt(residual_layers)
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def synthetic_tokens(n_sequences, config, seed=0):
    """Token data with something to learn: each sequence walks a fixed random Markov chain in
    which every token has 4 likely successors. Returns (inputs, targets), both (n, T) int64,
    targets being inputs shifted left by one. No downloads; same seed, same data."""
    gen = torch.Generator().manual_seed(seed)
    V, T = config.vocab_size, config.seq_len
    successors = torch.randint(0, V, (V, 4), generator=gen)  # the chain's 4 likely next tokens
    tokens = torch.empty(n_sequences, T + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, V, (n_sequences,), generator=gen)
    for t in range(T):
        pick = torch.randint(0, 4, (n_sequences,), generator=gen)
        nxt = successors[tokens[:, t], pick]
        noise = torch.rand(n_sequences, generator=gen) < 0.1  # 10% uniformly random tokens
        tokens[:, t + 1] = torch.where(noise, torch.randint(0, V, (n_sequences,), generator=gen), nxt)
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def synthetic_regression(n_samples, config, seed=0):
    """(inputs (n, d_in), targets (n, d_out)) from a fixed random linear map plus noise."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(config.d_in, config.d_out, generator=gen) / math.sqrt(config.d_in)
    x = torch.randn(n_samples, config.d_in, generator=gen)
    return x, x @ w + 0.01 * torch.randn(n_samples, config.d_out, generator=gen)
