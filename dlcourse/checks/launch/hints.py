"""The hint levels of exercises/00_launch.ipynb, by exercise id."""

HINTS = {
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
}
