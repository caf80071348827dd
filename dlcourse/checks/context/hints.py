"""The hint levels of exercises/08_context_parallel.ipynb, by exercise id."""

HINTS = {
    "merge_partials": (
        "each out_i is normalised by its own block's sum exp(lse_i); the merged out is "
        "normalised by the sum of both",
        "the merged lse is log(exp(lse_1) + exp(lse_2)); each block's out is weighted by "
        "exp(lse_i - lse), its share of the whole normaliser; with lse in the thousands exp "
        "overflows, so never take exp of an lse alone",
        "lse = torch.logaddexp(lse_1, lse_2) (it subtracts the larger first); out = "
        "exp(lse_1 - lse)[..., None] * out_1 + exp(lse_2 - lse)[..., None] * out_2; a -inf lse "
        "gives weight 0, as it should",
    ),
    "zigzag_positions": (
        "number the 2·cp chunks from 0; which chunk mirrors chunk r from the other end?",
        "chunk c holds positions c·L to (c+1)·L - 1 with L = seq_len // (2·cp); the mirror of "
        "chunk r is the (r+1)-th chunk from the end",
        "cut torch.arange(seq_len) into 2·cp chunks (torch.chunk) and return chunk r followed "
        "by chunk 2·cp - 1 - r",
    ),
    "ring_attention_step": (
        "post the transfer without waiting (isend/irecv or batch_isend_irecv), compute this "
        "block meanwhile, then wait",
        "the causal mask comes from the global positions: query i sees key j when q_pos[i] >= "
        "kv_pos[j], its own position included; a block that no query can see adds nothing, "
        "and a row that sees no key of the block must not turn into NaN",
        "receive into torch.empty_like(kv) from the group's rank (rank - 1) % cp while kv goes "
        "to its rank (rank + 1) % cp, with rank = dist.get_rank(group): a rank of the group, "
        "while torch 2.13 reads P2POp's peer= (and isend's dst=) as a global rank, so pass "
        "group_peer= (group_dst=/group_src=) or dist.get_global_rank(group, ...); the two differ "
        "whenever the CP group is not the world (a DP x CP or TP x CP grid); scores = q kᵀ/√d "
        "masked with -inf, block_lse = logsumexp(scores), block_out = exp(scores - block_lse) v "
        "(NaN rows to 0); merge with your merge_partials; wait; return (out, lse, kv_next)",
    ),
    "seq_to_heads": (
        "cut x into cp groups of heads; group j is what rank j needs from you",
        "dist.all_to_all(received, pieces) sends pieces[j] to rank j and fills received[i] with "
        "what rank i sent you: your heads, rank i's s/cp tokens",
        "pieces = [h.contiguous() for h in x.chunk(cp, dim=1)], received = empty_like each, "
        "one all_to_all, then concatenate received along the sequence dimension (dim 2), "
        "rank 0's tokens first",
    ),
    "cp_bytes_per_layer": (
        "count the messages this rank sends in one layer, forward and backward, and the values "
        "in each; receives are other ranks' sends",
        "ring/zigzag: K and V of s/cp tokens, 2·b·(s/cp)·h values, sent cp - 1 times per pass; "
        "forward is one pass, backward two (K/V again, dK/dV home). Ulysses: 4 all-to-alls "
        "each way of b·(s/cp)·h values, of which a rank sends (cp - 1)/cp. allgather: an "
        "all-gather forward and a reduce-scatter backward of 2·b·s·h values, a rank sending "
        "(cp - 1)/cp of them",
        "with B = b·s·h·itemsize: ring/zigzag forward (cp - 1)·2B/cp, backward twice that; "
        "ulysses 4·(cp - 1)·B/cp² each way; allgather 2·(cp - 1)·B/cp each way",
    ),
}
