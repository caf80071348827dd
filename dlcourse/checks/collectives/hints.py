"""The hint levels of exercises/02_collectives.ipynb, by exercise id."""

HINTS = {
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
}
