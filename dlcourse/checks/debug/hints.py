"""The hint levels of exercises/10_debugging.ipynb, by exercise id."""

HINTS = {
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
}
