"""Hint levels of lessons 04-07's exercises (`hints/__init__.py` joins the tables)."""

HINTS = {
    # ------------------------------------------------------------ lesson 04: tensor parallel
    "column_parallel_linear": (
        "each rank computes some columns of y from the whole x: which collective gives every "
        "rank every rank's piece?",
        "this rank's out/t output features are F.linear(x, weight, bias), computed without any "
        "communication; only putting the t pieces together needs the other ranks",
        "all-gather the pieces into a list of t tensors shaped like this rank's piece (dist."
        "all_gather fills a list you make first)",
        "the output features are y's last dim: concatenate the gathered pieces along the last "
        "dim, rank 0's first, and return that on every rank",
    ),
    "row_parallel_linear": (
        "this rank's columns of W multiply only part of x: which part, and how do the ranks' "
        "results combine?",
        "this rank's slice of x is the r-th of t blocks of its last dim; its product with "
        "weight.T has y's whole shape but is only one term of a sum over the ranks",
        "a collective that adds the ranks' tensors and leaves the sum on every rank finishes y; "
        "the bias belongs to the sum once, not once per rank",
        "take the slice, multiply it by weight.T, all-reduce the result over the group, then "
        "add the bias after the all-reduce (added on every rank before it, it counts t times)",
    ),
    "MegatronF": (
        "forward: every rank already holds x; backward: every rank's layer used x, so whose "
        "gradient is x's gradient?",
        "forward has nothing to compute: every rank returns x's values as they are (x itself, "
        "or a view of it as the lesson's comm.py makes with Tensor.view_as; autograd gives "
        "either output f's backward), and keeps in ctx what backward will need",
        "each rank's backward receives only the gradient that flowed through its own rows of "
        "W, its share of x's gradient; x's whole gradient is the sum of every rank's share",
        "forward keeps the group in ctx (ctx.group = group) and returns a view of x; backward "
        "all-reduces a contiguous copy of the incoming gradient over ctx.group and returns it, "
        "with None for the group",
    ),
    "MegatronG": (
        "forward sums the ranks' terms; what comes after g runs the same on every rank: what "
        "gradient does each term need?",
        "forward: the layer's output is the sum of the ranks' shares. The collective that sums "
        "works in place, and the caller's tensor must keep its values: sum a copy",
        "backward: the loss after g is the same on every rank, so every rank already holds the "
        "whole gradient of the sum, and a sum has slope 1 in each of its terms. torch's "
        "differentiable all_reduce (torch.distributed.nn) sums in backward too: t times too "
        "large",
        "forward: clone x, all-reduce the clone over the group, return it; backward: return the "
        "incoming gradient as it is, and None for the group, with no communication",
    ),
    "qkv_shard": (
        "the fused weight is W_q, W_k and W_v stacked: which rows of each do this rank's heads "
        "use?",
        "cutting the whole (3h, h) weight into t contiguous blocks of rows does not work: rank "
        "0's block is q rows of several ranks' heads (for t = 2, with part of k), not its own "
        "q, k and v",
        "cut the (3h, h) weight into its three (h, h) parts along dim 0; this rank's heads are "
        "the r-th of t blocks of rows in each part",
        "concatenate this rank's block of q, of k and of v along dim 0; cut the bias the same "
        "way, or return None for it when the layer has none",
    ),
    "vocab_parallel_cross_entropy": (
        "a token's loss needs the max of its logits, its sum of exp and its target's logit: "
        "which can each rank compute over its own ids, and how do the ranks' parts combine?",
        "with m the max of a token's V logits z and y its target, loss = log(sum over v of "
        "exp(z_v - m)) - (z_y - m): subtracting m changes nothing and keeps exp from "
        "overflowing",
        "each rank computes its part over its own ids: the max of its logits, its sum of "
        "exp(z - m), and z_y - m if it holds y (0 otherwise); one all-reduce each finishes "
        "them, op MAX for m and sums for the two others: 3N numbers, never the logits",
        "detach m (it needs no gradient; a plain all_reduce with dist.ReduceOp.MAX); make the "
        "two sums with MegatronG so that backward hands each rank its own gradient; rank r "
        "holds ids r V/t to (r + 1) V/t - 1; return the mean over tokens of log(sum) - "
        "(z_y - m)",
    ),
    # ------------------------------------------------------------ lesson 05: ZeRO
    "shard_of": (
        "lay the parameters end to end in one flat tensor; every rank must get the same number "
        "of elements, however many there are",
        "s = ceil(Ψ / N) elements per rank: pad the flat tensor with zeros at its end to N x s, "
        "so that it cuts into N equal pieces",
        "concatenate the flattened parameters, pad with zeros to N x s, and return a copy of "
        "elements r s to (r + 1) s, with N and r asked of the group",
    ),
    "zero_step": (
        "each rank needs only its shard of the averaged gradient: which collective hands every "
        "rank a different piece of a sum?",
        "an all-reduce is a reduce-scatter (each rank gets the sum of its own shard) followed by "
        "an all-gather (every rank gets every shard); stage 1 puts the optimizer step on the "
        "shard between the two halves",
        "lay the gradients out as the masters are: flattened end to end in parameter order, "
        "zeros for a None, padded with zeros to N x s; reduce-scatter that buffer "
        "(dist.reduce_scatter_single) and divide by N: the ranks hold equal samples",
        "put the averaged shard in master.grad and set every p.grad to None; step the optimizer; "
        "all-gather the N masters into one N x s buffer (dist.all_gather_single) and copy its "
        "first Ψ elements back into the parameters, one parameter's numel at a time, in order",
    ),
    "gather_and_free": (
        "the unit's parameters exist only while it computes: before and after its forward, "
        "before and after its backward",
        "a module runs hooks at exactly those four moments: register_forward_pre_hook, "
        "register_forward_hook, register_full_backward_pre_hook, register_full_backward_hook; "
        "a hook must return None (a value a forward hook returns replaces the output)",
        "full was freed by resizing its storage to 0 bytes, as the lesson's stage3.py frees a "
        "unit; resizing it back to full.numel() x full.element_size() bytes gives the views "
        "memory but not values: an all-gather of the shards into full (dist.all_gather_single) "
        "fills them in rank order",
        "write two small functions, gather (resize back, all-gather into full) and free "
        "(resize to 0); register gather as the forward pre-hook and the full backward pre-hook, "
        "free as the forward hook and the full backward hook; each returns None",
    ),
    "zero_bytes_per_rank": (
        "a shard holds a whole number of elements, and every rank holds the same number",
        "bytes per element of each part: mixed precision 2 (bf16 parameters), 2 (bf16 "
        "gradients) and 12 (fp32 master weights, momentum and variance); fp32 training 4, 4 "
        "and 8 (momentum and variance)",
        "stage s partitions the first s of (optimizer state, gradients, parameters): a "
        "partitioned part holds ceil(Ψ / N) elements per rank, padding included; a part the "
        "stage keeps whole holds all Ψ, no padding",
        "multiply each part's element count by its bytes per element and return the three "
        "whole numbers in a dict with the keys 'params', 'grads' and 'optimizer'",
    ),
    # ------------------------------------------------------------ lesson 06: pipeline
    "stage_boundaries": (
        "count the blocks each stage holds first; the boundaries are where one stage's blocks "
        "end and the next one's begin",
        "divmod(n_layers, n_stages) gives the blocks every stage holds and how many are left "
        "over; the last stage must not take one of those, since it also runs the output layer "
        "and the loss",
        "give the left-over blocks one each to the first stages (as torch.tensor_split does) or "
        "to the middle ones (as Llama 3 does); never to the last",
        "start a list at 0 and, for each stage s, add the last boundary plus that stage's size "
        "(one more while s is below the remainder, if the first stages take the extras); the "
        "list ends at n_layers",
    ),
    "exchange": (
        "both neighbours call exchange at the same moment: if both start with a blocking "
        "dist.send, both wait forever",
        "three ways out: post one of the two without waiting (dist.isend and dist.irecv return "
        "at once, .wait() later), order the pair by rank (the lower rank sends first while the "
        "higher receives first), or post both together with dist.batch_isend_irecv, as torch's "
        "pipelining does",
        "receive into a new buffer shaped and typed like tensor (torch.empty_like): the caller "
        "still needs tensor; name peer as the source, or a receive may take another rank's "
        "message",
        "make the buffer, post the send of tensor to peer and the receive from peer without "
        "waiting on either (two dist.P2POp in dist.batch_isend_irecv), then wait on both and "
        "return the buffer",
    ),
    "last_stage_backward": (
        "the step's loss is the mean over all n_micro micro-batches, and each backward adds its "
        "micro-batch's part into .grad",
        "with micro-batches of equal size, the whole batch's mean loss is the mean of the "
        "n_micro micro-batch losses: each backward must start from its loss divided by n_micro, "
        "or every gradient in the pipeline is n_micro times too large",
        "scale the loss itself before backward, not the gradients after it: the gradient of x "
        "that goes back to the earlier stages must be scaled too. x arrives as a plain tensor: "
        "ask for its gradient before the forward",
        "mark x as requiring a gradient, run the stage and the loss, divide the loss by n_micro, "
        "run backward, and return x's gradient; zero nothing, the micro-batches add up",
    ),
    "schedule_1f1b": (
        "three phases: a warm-up of forwards, a steady state of one forward then one backward, a "
        "cool-down of backwards",
        "a rank's first backward can come only after the stages after it have run that "
        "micro-batch's forward: each forward it runs meanwhile keeps one of those stages busy, "
        "and each one it holds counts against its p - rank",
        "the warm-up fills the stages after this rank: p - rank - 1 forwards, never more than "
        "n_micro; the last stage has none and runs each backward right after its forward",
        "after the warm-up, each remaining forward (of the next micro-batch) is followed by the "
        "backward of the oldest micro-batch still held; then the backwards left, oldest first",
    ),
    "bubble_fraction": (
        "count the time a stage waits while the pipeline fills and drains, and the time it works",
        "in units of one forward plus one backward, a stage works n_micro units and waits "
        "n_stages - 1 of them",
        "the share is the waiting time over the whole step's time, waiting plus working",
    ),
    # ------------------------------------------------------------ lesson 07: combining
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


# ---------------------------------------------------------------- lesson 06: interleaved 1F1B
HINTS["schedule_interleaved"] = (
    "write the order of the rank's forwards and the order of its backwards first; then it is "
    "1F1B over those two lists",
    "forwards: micro-batches 0..p-1 on chunk 0, the same p on chunk 1, ..., on chunk v - 1, then "
    "the next p micro-batches; backwards: the same groups, the chunks from v - 1 down to 0, as "
    "the gradient comes back through the last chunk first",
    "the warm-up (Megatron-LM's): (v - 1) p forwards bring the first group up to the last "
    "chunk, and 2 (p - r - 1) more keep rank r busy while micro-batch 0 goes through the ranks "
    "after it on that chunk and its gradient comes back; never more than the v m there are",
    "run that many forwards, then, while forwards are left, the next forward followed by the "
    "oldest backward, then the backwards left, in their order",
)

# ---------------------------------------------------------------- lesson 04: sequence parallelism
HINTS["GatherSequence"] = (
    "forward: every rank needs every rank's tokens; backward: every rank's layers used this "
    "rank's tokens",
    "forward is an all-gather along dim 1, the sequence, the blocks in rank order; in backward "
    "each rank holds a gradient for all T tokens, its own layers' part of it",
    "backward: the gradient of this rank's tokens is the sum over the ranks of their gradients "
    "for those tokens, which is one reduce-scatter along dim 1",
    "forward: dist.all_gather into t buffers shaped like x, torch.cat along dim 1; backward: "
    "chunk the gradient into t blocks along dim 1 (made contiguous), dist.reduce_scatter them "
    "into one (B, T/t, h) buffer, return it and None",
)
HINTS["ReduceScatterSequence"] = (
    "it is GatherSequence read backwards: its forward is that one's backward, and the other way "
    "round",
    "forward: each rank holds a partial (B, T, h) from its row-parallel layer; the output is the "
    "sum over the ranks, of which this rank keeps its own T/t tokens: a reduce-scatter along dim 1",
    "backward: every rank's partial fed every rank's tokens, so the input's gradient is the whole "
    "(B, T, h): all-gather the ranks' (B, T/t, h) gradients along dim 1",
)
HINTS["sync_layernorm_grads"] = (
    "which tokens went into this rank's LayerNorm gradient, and which did the one-process "
    "model's see?",
    "a LayerNorm's weight gradient is a sum over tokens; each rank summed over its own T/t, so "
    "the whole gradient is the sum of the ranks' (not their mean)",
    "all-reduce (sum) layernorm.weight.grad and layernorm.bias.grad over the group, in place; "
    "the parameters themselves stay as they are",
)
