"""The router logits lesson 09's routing checks draw (`route_with_capacity.py`,
`load_balance_loss.py`), afresh on each run: float64, skewed so that some experts are crowded.
Probabilities never tie in these cases (continuous random logits), except where the loss's
value does not depend on the tie: uniform routing.
"""

import torch


# float64 softmax, a sum of k values and one division: rounding ~1e-16 relative; 1e-12 leaves
# room for another order of the same operations (a softmax over the k chosen logits instead)
RTOL = 1e-12


def draw_logits(rng, n_tokens, n_experts, skew=True):
    """(N, E) float64 router logits; with skew, a few favourite experts get +1 to +3."""
    gen = torch.Generator().manual_seed(rng.randrange(2**62))
    logits = torch.randn(n_tokens, n_experts, generator=gen, dtype=torch.float64)
    if skew:
        for e in rng.sample(range(n_experts), max(1, n_experts // 3)):
            logits[:, e] += rng.uniform(1, 3)
    return logits
