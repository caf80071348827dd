"""Hint levels of lessons 08-10's exercises (`hints/__init__.py` joins the tables)."""

HINTS = {
    # ------------------------------------------------------------ lesson 08: context parallel
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
}

HINTS.update({
    # ------------------------------------------------------------ lesson 08: bytes per layer
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
})

HINTS.update({
    # ------------------------------------------------------------ lesson 09: experts
    "route_with_capacity": (
        "route first, as if there were no capacity; then walk each expert's queue in the order "
        "the contract gives and count",
        "softmax over dim -1 (each token's E experts), probs.topk(k) for the k most likely, the "
        "chosen probabilities divided by their sum; capacity None keeps everything",
        "the queue of expert e: every token's first choice of e in token order, then every "
        "second choice, ...; an assignment's place = assignments before it in that queue; kept "
        "iff place < capacity. One-hot the experts choice-major (experts.T.flatten()) and take "
        "an exclusive cumulative sum down the rows",
    ),
    "load_balance_loss": (
        "two numbers per expert: how often it was chosen, and how likely the router thought it",
        "f_e = (number of top-k choices equal to e) / (N·k), a count with no gradient; P_e = the "
        "softmax probabilities of e averaged over the N tokens, with their graph",
        "probs = softmax(logits, dim=-1); counts = bincount of probs.topk(k).indices, as "
        "float64 before dividing by N·k; return E times the sum over e of f_e · P_e",
    ),
    "dispatch_to_experts": (
        "a rank cannot size its receive buffer before it knows how many rows each rank will "
        "send it: exchange the counts first",
        "bincount the experts (E values); an all_to_all_single of those counts gives each rank "
        "an (ep, E/ep) table: row s = what rank s sends to each of its experts",
        "sort the rows by expert (torch.sort(experts, stable=True)), so they are grouped by "
        "destination rank; send split r = this rank's counts of rank r's experts, summed; "
        "receive split s = row s of the table, summed; one all_to_all_single of the rows",
    ),
    "moe_layer_counts": (
        "write down every weight matrix of the layer with its shape: the router's and one "
        "expert's",
        "router: Linear(h, E), no bias, E·h; one expert: Linear(h, f) and Linear(f, h), 2·h·f "
        "weights and f + h biases when bias; the layer holds E experts",
        "total = router + E · expert; active = router + k · expert; forward FLOPs per token = "
        "2 · (E·h + k · 2·h·f): one multiply and one add per weight of the matrices the token "
        "meets",
    ),
})

HINTS.update({
    # ------------------------------------------------- lesson 09: all-to-all bytes per layer
    "a2a_bytes_per_layer": (
        "follow one token's rows through the layer: where they go in the forward, and where "
        "they come back; then the backward",
        "each token is sent as top_k rows of hidden values, itemsize bytes each; under uniform "
        "routing 1/ep of them go to the rank's own experts and never leave it",
        "one all-to-all moves top_k · tokens · hidden · itemsize · (ep - 1)/ep bytes off the "
        "rank; the forward has two (dispatch, combine), the backward their two gradients",
    ),
})

HINTS.update({
    # ---------------------------------- lesson 09: the permutation by destination and its inverse
    "permute_by_destination": (
        "number the assignments (token n's j-th choice is n·k + j) and list them expert by "
        "expert; within one expert keep the order they had",
        "flatten experts to (N·k,) and sort by expert with a stable sort: equal keys keep their "
        "order (an unstable sort may reorder one expert's assignments, and the grader's cases "
        "have many per expert)",
        "torch.argsort of the flat experts with stable=True (np.argsort kind='stable'); or a "
        "counting sort: counts per expert with bincount(minlength=n_experts), so an expert "
        "nobody chose keeps its 0, each expert's first place from the exclusive cumulative sum",
    ),
    "unpermute": (
        "row i of y is the output for assignment order[i]: which token is that, and which "
        "choice of it?",
        "undo the permutation: row i goes back to place order[i] (a scatter, back[order] = y), "
        "or gather with the inverse permutation; gathering with order itself applies it twice",
        "back in assignment order is (N·k, h): view it (N, k, h), the k outputs of each token, "
        "multiply by weights as (N, k, 1) and sum over the k; or index_add each row of y into "
        "token order[i] // k, times weights.flatten()[order[i]]",
    ),
})

HINTS.update({
    # ------------------------------------------------------------ lesson 10: debugging
    "first_divergence": (
        "the traces are already in the order the finder reads them: walk them, and stop at the "
        "first tensor that is really different",
        "zip the two traces entry by entry (step, phase, {name: tensor}); within an entry take "
        "the names in the reference dict's order: forward order, backward order, the model's",
        "for each name: diff = largest |parallel - reference|; it differs when diff > tolerance "
        "x max(1, largest |reference|) (float64 rounding stays far below); return (step, phase, "
        "name) at once, and None after the last entry",
    ),
    "mismatched_call": (
        "line the ranks up call by call: a hang starts at the first index where they do not "
        "all make the same call",
        "at index i, each rank's call is (op, nbytes), or nothing when its list is shorter; "
        "rank 0 can be the wrong one, so do not take it as the model",
        "count the (op, nbytes) values over the ranks at index i (collections.Counter); the "
        "first i with more than one value: the rank whose value no other rank has, its call "
        "number i + 1 (calls count from 1), and its op and nbytes (None, None where it made no "
        "call)",
    ),
    "sync_sequence_parallel_grads": (
        "which parameters does every rank hold whole, but see only its own tokens through?",
        "the parameters used where a rank holds only its T/tp tokens: the LayerNorms, the "
        "position embedding, the row-parallel biases; look in dlcourse/parallel/tensor/ for how "
        "lesson 04's layers mark them; the sharded weights' gradients are whole already",
        "after backward, dist.all_reduce each marked gradient with op SUM over `group` (or "
        "concatenate them, all-reduce once, copy the pieces back): a sum, never an average, and "
        "nothing hard-coded about the number of ranks",
    ),
})

HINTS.update({
    # ------------------------------------------------ lesson 10: naming the bug, fixing it
    "name_the_bug": (
        "first where, then what: the earliest place over every rank's traces, then what the gap "
        "there looks like",
        "your first_divergence on each rank's (reference, parallel); keep the earliest in the "
        "traces' order (step, then phase, then name): a bug may show on one rank first",
        "where it parts says what broke: the parameters before step 1 (the start), an "
        "activation (the forward), a gradient (backward or a reduction); read each candidate's "
        "CATALOGUE[key].breaks, or run find_divergence(strategy, bug=key) in a cell of its own",
        "two candidates of one strategy can part at the same place: then look at the tensors "
        "there; do the ranks agree? is parallel / reference one constant at every element, or "
        "no multiple at all? Give each candidate the look its mechanism predicts, and return "
        "the candidate whose look this run has",
    ),
    "sync_tied_grads": (
        "which two ranks hold a copy of the tied matrix, and what must each copy's gradient be "
        "before the step?",
        "the first stage (is_first) holds tok_emb.weight, the last (is_last) lm_head.weight: "
        "each gradient holds only its own use; in one process the one matrix gets the sum of "
        "both; every other rank holds neither",
        "the last stage is group rank size - 1, not rank 1: ask `group` for its size, and "
        "dist.get_global_rank(group, i) for the peer; a stage holding both ends adds them "
        "itself; sending the parameter across makes the copies equal, not right",
        "on the two end ranks: post an isend of your copy's gradient and an irecv of the other's "
        "together (dist.batch_isend_irecv, so neither waits first), then add what came to your "
        "gradient; the other ranks return at once",
    ),
    "waited_call": (
        "a call number means something within one process group only: line the ranks up group "
        "by group",
        "for each pg_id, the largest collective_seq_id each rank's entries reach in it (0 where "
        "a rank has none); record_id and an entry's place in the list count every group's calls",
        "the group where the ranks reach different numbers is the one that hangs: the rank "
        "behind is the one the others wait on, and they wait in the call after its last (its "
        "last + 1): rank 0 can be the one behind",
    ),
})
