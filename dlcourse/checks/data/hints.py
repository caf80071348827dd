"""The hint levels of exercises/03_data_parallel.ipynb, by exercise id."""

HINTS = {
    "broadcast_parameters": (
        "every rank must end up with the same weights as one chosen rank: which collective "
        "copies one rank's tensor to all?",
        "broadcast each parameter's data in the same order on every rank; the source is the "
        "group's first rank, which broadcast names by its global rank",
        "for every parameter (frozen ones too), broadcast its .data from "
        "dist.get_global_rank(group, 0) within the group; every rank makes the same calls",
    ),
    "data_parallel_step": (
        "the step must equal one process's step on all ranks' samples: what must be averaged, "
        "and weighted by what?",
        "each rank's loss is a mean over its own samples; weight it by its share of all the "
        "samples (an all-reduce of the counts), then sum the gradients over the ranks",
        "zero the gradients, scale the loss by len(x) / N before backward, all-reduce every "
        "gradient that exists, then step the optimizer",
    ),
    "make_buckets": (
        "backward produces the last layer's gradients first: fill buckets in that order",
        "walk the trainable parameters from last to first, adding each to the open bucket and "
        "its bytes to a running count",
        "close a bucket as soon as its bytes reach bucket_cap_mb MiB (2**20 bytes each), with "
        "the parameter that reached it inside; the last, partly full bucket counts too",
    ),
    "all_reduce_buckets": (
        "one all-reduce per bucket, not per parameter: the gradients must travel as one tensor",
        "concatenate a bucket's flattened gradients, all-reduce that one tensor, and put the "
        "pieces back where they came from",
        "use zeros where a gradient is None, divide the sum by the world size, split it by each "
        "parameter's numel and copy each piece into its .grad in the order you packed",
    ),
    "accumulate_step": (
        "the ranks should talk once per step, not once per micro-batch: what does no_sync do?",
        "inside no_sync, backward only adds into .grad; the backward outside it also averages "
        "the accumulated sum over the ranks",
        "zero once, run every micro-batch but the last inside no_sync with its loss weighted by "
        "its share of this rank's samples, the last one outside, then step",
    ),
}
