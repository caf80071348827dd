"""The hint levels of exercises/04_tensor_parallel.ipynb, by exercise id."""

HINTS = {
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
    "GatherSequence": (
        "forward: every rank needs every rank's tokens; backward: every rank's layers used this "
        "rank's tokens",
        "forward is an all-gather along dim 1, the sequence, the blocks in rank order; in backward "
        "each rank holds a gradient for all T tokens, its own layers' part of it",
        "backward: the gradient of this rank's tokens is the sum over the ranks of their gradients "
        "for those tokens, which is one reduce-scatter along dim 1",
        "forward: dist.all_gather into t buffers shaped like x, torch.cat along dim 1; backward: "
        "chunk the gradient into t blocks along dim 1 (made contiguous), dist.reduce_scatter them "
        "into one (B, T/t, h) buffer, return it and None",
    ),
    "ReduceScatterSequence": (
        "it is GatherSequence read backwards: its forward is that one's backward, and the other "
        "way round",
        "forward: each rank holds a partial (B, T, h) from its row-parallel layer; the output is "
        "the sum over the ranks, of which this rank keeps its own T/t tokens: a reduce-scatter "
        "along dim 1",
        "backward: every rank's partial fed every rank's tokens, so the input's gradient is the "
        "whole (B, T, h): all-gather the ranks' (B, T/t, h) gradients along dim 1",
    ),
    "sync_layernorm_grads": (
        "which tokens went into this rank's LayerNorm gradient, and which did the one-process "
        "model's see?",
        "a LayerNorm's weight gradient is a sum over tokens; each rank summed over its own T/t, so "
        "the whole gradient is the sum of the ranks' (not their mean)",
        "all-reduce (sum) layernorm.weight.grad and layernorm.bias.grad over the group, in place; "
        "the parameters themselves stay as they are",
    ),
}
