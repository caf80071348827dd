"""The hint levels of exercises/05_zero.ipynb, by exercise id."""

HINTS = {
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
}
