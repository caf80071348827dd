"""The hint levels of exercises/07_combining.ipynb, by exercise id."""

HINTS = {
    "rank_coords": (
        "the last axis of `order` is the innermost: consecutive ranks differ in it alone",
        "the rank is a number written with mixed digits, one per axis, the last axis's digit "
        "changing fastest, as in a C-ordered array of the grid's shape",
        "walk the axes from the last of `order` to the first: divmod the rank by that axis's "
        "size, the remainder is its coordinate, the quotient goes on to the next axis",
    ),
    "axis_groups": (
        "two ranks share a group of `axis` when all their other coordinates are equal",
        "only the innermost axis's groups are runs of consecutive ranks; the others are strided, "
        "so work from the coordinates, not from rank numbers",
        "compute every rank's coordinates, key each rank by its coordinates on the other two "
        "axes, and collect the ranks of each key into one group",
    ),
    "step_collectives": (
        "an axis of size 1 is a group of one rank: it has nothing to exchange",
        "each axis carries one strategy: pp moves activations and gradients between stages, dp "
        "combines the replicas' gradients, tp combines the partial results of split matrices",
        "by the end of a step: pp stages have handed their activations on and got their "
        "gradients back; dp replicas hold the sum of all replicas' gradients (ZeRO: each rank "
        "only its shard's sum, and before the next forward every updated shard); tp ranks hold "
        "the sum of their partial results (with sequence parallelism: entering a region every "
        "rank needs the whole sequence, leaving it each keeps the sum of its own part; inside a "
        "pipeline the last stage needs the whole logits)",
        "pp: send and recv; dp: all_reduce, or with ZeRO reduce_scatter and all_gather; tp: "
        "all_reduce, plus all_gather and reduce_scatter with sequence parallelism, plus "
        "all_gather on a pipeline's last stage; empty sets for axes of size 1",
    ),
    "grid_state_bytes": (
        "first find the parameters one rank holds, then ask which axis ZeRO shards them over",
        "tp cuts every layer into tp slices and pp gives each stage 1/pp of the layers, so a "
        "rank holds Ψ / (tp pp) parameters; the dp replicas hold the same piece, which ZeRO "
        "shards",
        "bytes per parameter 2 + 2 + 12 (mixed) or 4 + 4 + 8 (fp32) for parameters, gradients "
        "and optimizer state; multiply each by Ψ / (tp pp) and divide the first zero_stage of "
        "(optimizer, gradients, parameters) by dp",
    ),
    "cost_per_million_tokens": (
        "the bubble is the idle share of the step: step x (1 - bubble) = compute",
        "lesson 06: bubble = (p - 1)/(m + p - 1) of the step; every GPU is paid for while it "
        "idles, and the price is per GPU and per hour while the times are in seconds",
        "step = compute / (1 - bubble) (that is compute x (m + p - 1)/m); multiply n_gpus by "
        "the price and by the step in hours (seconds / 3600), then divide by tokens / 1e6",
    ),
    "best_layout": (
        "a layout that does not fit in memory cannot run, however cheap it would be",
        "keep the layouts whose bytes_per_gpu are at most the budget; compare the rest by what "
        "a million tokens cost, which counts every GPU and the pipeline's idle time, not by "
        "the compute or the step time",
        "filter on bytes_per_gpu <= memory_budget, return None if nothing is left, else the "
        "name of the layout whose cost_per_million_tokens (bubble included) is least",
    ),
    "broken_rules": (
        "each rule is one division: which size must divide which?",
        "heads over tp (K/V heads may also divide tp: replicated); layers over pp x v virtual "
        "stages, only when v > 1; micro-batches at least pp, a multiple of pp when v > 1; the "
        "sequence over 2 cp zig-zag chunks",
        "collect a name for each failed test: n_heads % tp; kv % tp and tp % kv; pp > n_layers; "
        "v > 1 and n_layers % (pp v); pp > 1 and m < pp; v > 1 and (pp == 1 or m % pp); "
        "cp > 1 and seq_len % (2 cp)",
    ),
    "first_stage_activation_bytes": (
        "a rank holds a micro-batch's activations from its forward until its backward",
        "1F1B: the first rank runs p - 1 warm-up forwards and one more before its first "
        "backward, so min(m, p) micro-batches of its L/p layers; interleaving's first rank runs "
        "2(p - 1) + (v - 1)p warm-up forwards, each through a chunk of L/(p v) layers",
        "1F1B: min(m, p) x L/p x layer_bytes; interleaved: (2(p - 1) + (v - 1)p + 1) chunks, "
        "at most m v, x L/(p v) x layer_bytes; or walk the schedule and count the peak",
    ),
}
