"""The planner (lesson 07): for a model, a batch and a cluster, which layouts fit, how fast each
trains, what a million tokens cost, ranked so that "simple, efficient, cheap" is a short table.

    hardware.py    GPU (memory, peak, links, price) with sources; Cluster
    layouts.py     Workload, Layout (dp x tp x pp, ZeRO stage, micro-batches, recompute,
                   interleaving), the rules a layout must obey, every valid layout
    estimate.py    bytes per GPU, step time, tokens/s, MFU, $ per million tokens, from the
                   formulas lessons 01-06 measured
    rank.py        plan(): the ranked table, the Pareto front of cost against time, and why
                   nothing fits when nothing does
    published.py   published runs (Megatron-LM, Llama 3) the planner is checked against
"""
