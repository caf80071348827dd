"""The hint levels of exercises/06_pipeline.ipynb, by exercise id."""

HINTS = {
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
    "schedule_interleaved": (
        "write the order of the rank's forwards and the order of its backwards first; then it is "
        "1F1B over those two lists",
        "forwards: micro-batches 0..p-1 on chunk 0, the same p on chunk 1, ..., on chunk v - 1, "
        "then the next p micro-batches; backwards: the same groups, the chunks from v - 1 down to "
        "0, as the gradient comes back through the last chunk first",
        "the warm-up (Megatron-LM's): (v - 1) p forwards bring the first group up to the last "
        "chunk, and 2 (p - r - 1) more keep rank r busy while micro-batch 0 goes through the ranks "
        "after it on that chunk and its gradient comes back; never more than the v m there are",
        "run that many forwards, then, while forwards are left, the next forward followed by the "
        "oldest backward, then the backwards left, in their order",
    ),
}
