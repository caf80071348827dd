"""The planner (lesson 07): for a model, a batch and a cluster, which layouts fit, how fast each
trains, what a million tokens cost, ranked so that "simple, efficient, cheap" is a short table.

    hardware.py    GPU (memory, peak, MAMF, HBM bandwidth, links, price) with sources; Cluster
    layouts.py     Workload, Layout (dp x tp x pp (x cp, ep), ZeRO stage, micro-batches,
                   recompute, interleaving; `Layout.grid` is the runtime's RankGrid), the
                   rules a layout must obey (the runtime's rule book, `dlcourse.parallel.rules`,
                   and the cluster's), every valid layout
    margin.py      what a real GPU holds beyond the counted peak: driver, CUDA context, NCCL
                   buffers, the allocator's reserve; `fits` keeps it
    op_checkpoint.py  torchtitan's selective checkpointing by op, measured on the course GPT
    estimate.py    bytes per GPU (lesson 06's in-flight count), step time, tokens/s, MFU,
                   $ per million tokens
    activations.py what one layer of any model saves for backward, tensor by tensor
    timing.py      the step's terms: matmuls, element-wise and loss kernels, Adam, tp / pp / dp
                   traffic
    calibration.py each GPU's one fitted number: the share of its MAMF a matmul keeps in a
                   step, from the published runs of that GPU marked "calibration"
    failures.py    the goodput term (lesson 11's goodput.py): tokens/s and $ include failures
    rank.py        plan(): the ranked table, the recommendation (the simplest of the layouts
                   that tie within the planner's error), why it beat the runner-up, the
                   Pareto front of cost against time, and why nothing fits when nothing does
    bands.py       which error band a plan is judged by: the dense runs', or the MoE runs'
    moe_spec.py    a mixture of experts as a spec (MoESpec), its dense and expert parameters
    moe_cost.py    what experts add (lesson 09): state over the expert-data-parallel ranks,
                   routed rows and activations, active FLOPs, the all-to-alls, load imbalance
    moe_estimate.py  an Estimate of an MoE layout from the dense terms and moe_cost's
    published_moe.py  DeepSeek-V3, Qwen3-235B and Mixtral runs held against the planner
    moe_imbalance.py  dropless routing's imbalance, calibrated on their balanced/dropless pairs
    moe_band.py    the spread of its errors on them, named misses aside: the band on an MoE's
                   cost and tie, and whether a layout lies in a named miss's regime
    published_runs.py  published runs (Megatron-LM, torchtitan, BLOOM, Llama 3), with sources
                   and each run's role: calibration or held out
    published.py   the planner checked against them; the spread of its errors is the band on
                   a dense model's cost
"""
