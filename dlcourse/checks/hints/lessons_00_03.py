"""Hint levels of lessons 00-03's exercises (`hints/__init__.py` joins the tables)."""

HINTS = {
    # ------------------------------------------------------------ lesson 00: launch
    "gather_all": (
        "one collective does the whole job: every rank sends its x and receives everyone's",
        "dist.all_gather fills a list you provide, one tensor per rank, each shaped like x and "
        "of x's dtype; make that list first",
        "make world_size empty tensors like x (torch.empty_like), pass the list and x to "
        "dist.all_gather, then stack the list along a new first dimension",
    ),
    "sum_to_rank0": (
        "only rank 0 needs the sum: which collective delivers a result to one rank only?",
        "dist.reduce(tensor, dst=0) adds every rank's tensor into rank 0's, in place, so give "
        "it a copy: the caller's x must keep its values",
        "clone x, reduce the clone to dst=0, return it on rank 0 and None on the others",
    ),
    # ------------------------------------------------------------ lesson 01: memory
    "count_gpt_params": (
        "print the named parameters of a tiny GPT and write each shape in terms of the config",
        "the parameters are the two embeddings, L identical blocks, the final LayerNorm and the "
        "output layer; count one block, then multiply",
        "a block holds two LayerNorms and four Linear layers (qkv h to 3h, proj h to h, fc h to "
        "4h, proj 4h to h); biases exist only with bias=True, and a tied output layer is the "
        "token embedding, counted once",
    ),
    "zero_model_state": (
        "start from the bytes each parameter costs in each part, then ask what each stage "
        "splits over the dp ranks",
        "mixed precision keeps 2 + 2 + 12 bytes per parameter (weights, gradients, fp32 "
        "optimizer state), fp32 training 4 + 4 + 8; stage 1 splits the optimizer state",
        "multiply n_params by each part's bytes; stage s divides by dp the first s of "
        "(optimizer, gradients, parameters) and leaves the others whole",
    ),
    "mlp_activation_bytes": (
        "for each operation of the block, ask what its backward needs to remember",
        "a Linear keeps its input for its weight's gradient, GELU keeps its input, dropout keeps "
        "its mask; measure one with SavedTensorLog to see the sizes",
        "count the saved tensors in units of one (B, T, h) tensor: fc's input is 1, GELU's input "
        "and proj's input are 4h wide, the dropout mask 1 when dropout > 0; times the element "
        "size",
    ),
    # ------------------------------------------------------------ lesson 02: collectives
    "ring_reduce_scatter": (
        "draw the ring for 4 ranks on paper: which chunk does rank r send in the first step, "
        "and which does it finish with?",
        "cut x into n chunks with tensor_split; in each of the n - 1 steps a rank passes one "
        "partial sum to its right neighbour and adds its own copy to the one arriving from the "
        "left",
        "keep running sums in clones of the chunks; at step k rank r sends the partial of chunk "
        "(r - k - 1) mod n and receives that of chunk (r - k - 2) mod n; start the send "
        "without waiting (isend) before the receive, or every rank waits for the others",
    ),
    "ring_all_gather": (
        "each rank starts with one chunk in place; after n - 1 steps it must hold all of them",
        "allocate the whole result and cut it into views with tensor_split; put your own chunk "
        "in its place, then pass on each step the chunk you received last",
        "at step k rank r sends chunk (r - k) mod n to the right and receives chunk "
        "(r - k - 1) mod n from the left straight into its place in the result; make the "
        "result with chunk's dtype",
    ),
    "ring_all_reduce": (
        "an all-reduce is two things you have already built, one after the other",
        "reduce-scatter leaves each rank one complete chunk of the sum; all-gather shares the "
        "complete chunks; do it on a flat view so any shape works",
        "take a flat view of the tensor (it shares its memory), reduce-scatter it, all-gather "
        "the result, and copy that into the flat view: the caller's tensor changes in place",
    ),
    "all_reduce_time": (
        "count the messages and the bytes of one rank: each message costs alpha plus its bytes "
        "times beta",
        "the ring all-reduce makes n - 1 steps in each of its two phases, and every step sends "
        "one chunk of nbytes / n",
        "time = (number of steps) x alpha + (bytes one rank sends) x beta, both phases "
        "counted",
    ),
    # ------------------------------------------------------------ lesson 03: data parallel
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
