"""The cost of a step, written out for lesson 07's planner checks (`cost_per_million_tokens.py`,
`best_layout.py`): a pipeline's step is its compute over the share lesson 06's bubble leaves
busy, and a million tokens cost the GPUs' hours of the steps that hold them.
"""

SECONDS_PER_HOUR = 3600


def reference_step(compute_time_s, n_stages, n_micro):
    """The step of a pipeline whose ranks would need compute_time_s without idling: the bubble
    is (p - 1)/(m + p - 1) of the step (lesson 06), so the step is the busy time over the rest."""
    return compute_time_s / (1 - (n_stages - 1) / (n_micro + n_stages - 1))


def reference_cost(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                   price_per_gpu_hour):
    step = reference_step(compute_time_s, n_stages, n_micro)
    dollars_per_step = n_gpus * price_per_gpu_hour * (step / SECONDS_PER_HOUR)
    return dollars_per_step * 1_000_000 / tokens_per_step
