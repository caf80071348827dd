"""The hint levels of exercises/09_experts.ipynb, by exercise id."""

HINTS = {
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
    "a2a_bytes_per_layer": (
        "follow one token's rows through the layer: where they go in the forward, and where "
        "they come back; then the backward",
        "each token is sent as top_k rows of hidden values, itemsize bytes each; under uniform "
        "routing 1/ep of them go to the rank's own experts and never leave it",
        "one all-to-all moves top_k · tokens · hidden · itemsize · (ep - 1)/ep bytes off the "
        "rank; the forward has two (dispatch, combine), the backward their two gradients",
    ),
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
}
