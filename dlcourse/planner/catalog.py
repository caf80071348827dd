"""The models the planner knows by name (lesson 07): lesson 01's GPT-2 and Llama 2 shapes, and
the published models it is checked against (`published.py`).

    model("llama-2-7b")    # case, spaces and underscores ignored
"""

from dlcourse.memory.calculator import REAL_MODELS, ModelSpec


def megatron_gpt(name, heads, hidden, layers):
    """A GPT as Narayanan et al. 2021 train it: 4h MLP, vocabulary 51,200, 2,048 tokens,
    Megatron-LM's default dropout (0.1, which Korthikanti et al. 2022 count)."""
    return ModelSpec(name, layers, hidden, heads, vocab_size=51200, seq_len=2048,
                     ffn=4 * hidden, kv_heads=heads, gated_mlp=False, bias=True, tied=True,
                     learned_positions=True, dropout=True)


# Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: 126 layers, width 16,384, FFN
# 53,248, 128 heads with 8 key/value heads, vocabulary 128,000 (128,256 with special tokens).
LLAMA3_405B = ModelSpec("Llama-3 405B", 126, 16384, 128, vocab_size=128256, seq_len=8192,
                        ffn=53248, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                        learned_positions=False)

# Llama 3.1 8B as torchtitan builds it (pytorch/torchtitan 9dec370, 2024-12-26, the commit of
# its H100 benchmarks: torchtitan/models/llama/__init__.py "8B" and model.py FeedForward): 32
# layers, dim 4,096, 32 heads, 8 key/value heads, ffn 1,024 x ceil(int(1.3 x int(2/3 x 4 x
# 4,096)) / 1,024) = 14,336; the tiktoken vocabulary of 128,256; untied output head.
LLAMA31_8B = ModelSpec("Llama-3.1 8B", 32, 4096, 32, vocab_size=128256, seq_len=8192,
                       ffn=14336, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                       learned_positions=False)

MODELS = {**REAL_MODELS, LLAMA3_405B.name: LLAMA3_405B, LLAMA31_8B.name: LLAMA31_8B}


def _key(name):
    return name.lower().replace(" ", "-").replace("_", "-")


def model(name):
    """The `ModelSpec` called `name`, or a ValueError listing the known names."""
    known = {_key(n): spec for n, spec in MODELS.items()}
    if _key(name) not in known:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known)}")
    return known[_key(name)]
