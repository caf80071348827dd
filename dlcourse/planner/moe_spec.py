"""A mixture-of-experts model as the planner sees it (lesson 09, `lessons/09_experts.ipynb`;
issue 34): a `ModelSpec` with experts, and its parameters split the way lesson 09 splits them,
"experts" (dealt out over ep ranks) and "dense" (everything else, routers and shared experts
included; `dlcourse.parallel.expert.measure.param_bytes`).

    MoESpec(...)                 # the catalogue's Mixtrals, DeepSeek-V3, Qwen3 (`catalog.py`)
    from_config(moe_config)      # the course's MoE GPT (`dlcourse.models.MoEConfig`) as a spec
    moe_params(spec)             # {"experts": ..., "dense": ...} parameters, whole model
    active_params(spec)          # those one token's forward uses: dense + k/E of the experts

Layer i is an MoE layer when i >= first_dense and (i + 1) % moe_every == 0 (DeepSeek-V3's
first three layers are dense; the course GPT's moe_every of lesson 09). A dense layer's MLP is
`ffn` wide; each expert, and each shared expert, `moe_ffn` wide; n shared experts count as one
MLP n x moe_ffn wide (lesson 09's `SharedExperts`). The router is an E x h matrix, no bias.

Multi-head latent attention (DeepSeek-V2/V3) does not fit `ModelSpec`'s q/k/v/o shapes; a spec
may give `attention_params` (one layer's attention weights, counted from the model's config) and
the counts here use it. The score FLOPs (`moe_cost.score_flops_per_token`) and an MoE layer's
saved Q, K, V and attention output (`moe_activations.py`) use `head_dims` when a spec gives
them: for DeepSeek-V3 MLA's 128 heads of 192-wide queries and keys and 128-wide values, not
7168 / 128 = 56; the dense planner's other terms (the transients) still see h / n_heads.

`dropless_imbalance` is the load imbalance the planner gives a dropless run of this model
(`moe_cost.imbalance`): how unevenly a trained router spreads its tokens is the model's, not
the planner's, and the catalogue gives it where a published pair of runs measures it
(`published_moe.py`: Mixtral's); other models get `moe_cost.DROPLESS_IMBALANCE`.

`route_nodes` is DeepSeek-V3's node-limited routing (report §2.1.2: each token to experts on
at most M = 4 nodes; config_671B.json's n_limited_groups): the network carries one copy of a
token to each of those nodes at most (`moe_cost.network_copies`).
"""

from dataclasses import dataclass

from dlcourse.memory.calculator import ModelSpec


@dataclass(frozen=True)
class MoESpec(ModelSpec):
    n_experts: int = None  # E: routed experts per MoE layer
    top_k: int = None  # k: experts each token goes to
    moe_ffn: int = None  # each expert's inner width (`ffn` stays the dense layers')
    n_shared_experts: int = 0  # DeepSeekMoE's shared experts: every token, weight 1
    first_dense: int = 0  # the first layers keep a dense MLP (DeepSeek-V3: 3)
    moe_every: int = 1  # of the rest, every moe_every-th is MoE (lesson 09's MoEConfig)
    capacity_factor: float = None  # None: dropless; else capacity ceil(c k N / E) (moe.py)
    attention_params: int = None  # one layer's attention weights, when not q/k/v/o (MLA)
    head_dims: tuple = None  # (query/key, value) width of a head, when not h / n_heads
    route_nodes: int = None  # node-limited routing: each token to at most this many nodes
    dropless_imbalance: float = None  # dropless, the busiest expert's rows against the mean
    #   where a published pair of this model's runs gives it; None: moe_cost.DROPLESS_IMBALANCE

    def __post_init__(self):
        for name in ("n_experts", "top_k", "moe_ffn"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoESpec.{name} must be a whole number >= 1, got {value!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoESpec: top_k {self.top_k} > n_experts {self.n_experts}")
        if self.dropless_imbalance is not None and self.dropless_imbalance < 1:
            raise ValueError(f"MoESpec.dropless_imbalance {self.dropless_imbalance} < 1: the "
                             f"busiest expert gets at least the mean")

    @property
    def moe_blocks(self):
        """Indices of the layers whose MLP is an MoE."""
        return [i for i in range(self.n_layers)
                if i >= self.first_dense and (i + 1) % self.moe_every == 0]


def from_config(config):
    """The course's `MoEConfig` (lesson 09) as an `MoESpec`: GELU MLPs, 4h dense, learned
    positions, LayerNorm with biases as the config says."""
    return MoESpec(f"course MoE GPT E{config.n_experts} k{config.top_k}", config.n_layers,
                   config.hidden, config.n_heads, vocab_size=config.vocab_size,
                   seq_len=config.seq_len, ffn=4 * config.hidden, kv_heads=config.n_heads,
                   gated_mlp=False, bias=config.bias, tied=config.tie_embeddings,
                   learned_positions=True, dropout=config.dropout > 0,
                   n_experts=config.n_experts, top_k=config.top_k, moe_ffn=config.ffn_hidden,
                   n_shared_experts=config.n_shared_experts, moe_every=config.moe_every,
                   capacity_factor=config.capacity_factor)


def mlp_params(spec, width):
    """One MLP of inner width `width`: 2 (GELU) or 3 (SwiGLU) h x width matrices, + biases."""
    h = spec.hidden
    return (3 if spec.gated_mlp else 2) * h * width + (width + h if spec.bias else 0)


def attention_params(spec):
    """One layer's attention weights: `spec.attention_params`, or q, k, v, o (+ biases)."""
    if spec.attention_params is not None:
        return spec.attention_params
    h = spec.hidden
    kv = spec.kv_heads * (h // spec.n_heads)
    return 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if spec.bias else 0)


def moe_params(spec):
    """{"experts": the routed experts of every MoE layer, "dense": the rest} (lesson 09's
    `param_bytes` split at ep = 1, one byte a value)."""
    h, n_moe = spec.hidden, len(spec.moe_blocks)
    norm = 2 * h if spec.bias else h
    shared = mlp_params(spec, spec.n_shared_experts * spec.moe_ffn) if spec.n_shared_experts \
        else 0
    layers = spec.n_layers * (attention_params(spec) + 2 * norm)
    layers += (spec.n_layers - n_moe) * mlp_params(spec, spec.ffn)
    layers += n_moe * (spec.n_experts * h + shared)  # routers and shared experts
    ends = spec.vocab_size * h + (spec.seq_len * h if spec.learned_positions else 0) + norm
    ends += 0 if spec.tied else spec.vocab_size * h
    return {"experts": n_moe * spec.n_experts * mlp_params(spec, spec.moe_ffn),
            "dense": layers + ends}


def active_params(spec):
    """Parameters one token's forward uses: the dense ones and k of the E experts of each MoE
    layer (lesson 09's `params_per_token`["active"]). About 6 FLOPs each in training."""
    split = moe_params(spec)
    return split["dense"] + split["experts"] * spec.top_k // spec.n_experts
