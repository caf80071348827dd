"""Check for lesson 11's second exercise (`exercises/11_checkpoints.ipynb`), on real gloo ranks:

    check_load_my_shard(load_my_shard)

A flat float64 tensor of `numel` values (a ZeRO unit's flat buffer) was saved by n ranks in
uneven chunks: `metadata = {"numel": L, "chunks": [{"file": f, "offset": o, "length": l}, ...]}`,
listed in no particular order, each file holding one chunk. On every rank of a job of m ranks,
`load_my_shard(metadata, files)` returns this rank's piece of the whole under the new layout, the
one `torch.tensor_split(whole, m)[rank]` gives (the first L % m ranks one value more), reading
chunks with `files.read(f)` only. n, m (2 to 4, n != m), L and the cuts are drawn; the check
compares element by element with the whole it saved, and counts what each rank read: only the
chunks that overlap its piece.
"""

import torch

from dlcourse.checks.checkpoint.answers import ANSWERS
from dlcourse.checks.checkpoint.in_rank import load_in_rank
from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail, fresh_cases
from dlcourse.checks.core import run_on_ranks

HINT = ("this rank's piece is [start, end) of the whole with torch.tensor_split's sizes; a chunk "
        "holds [offset, offset + length): copy the overlap of the two, end excluded")


def draw_checkpoint(rng, n, numel):
    """(whole (numel,), metadata, {file: chunk}): n uneven chunks (some may be empty), shuffled."""
    whole = torch.randn(numel, generator=torch.Generator().manual_seed(rng.randrange(10_000)),
                        dtype=torch.float64)
    cuts = sorted(rng.randrange(numel + 1) for _ in range(n - 1))
    bounds = list(zip([0] + cuts, cuts + [numel]))
    order = list(range(n))
    rng.shuffle(order)
    chunks = [{"file": f"rank{r}.pt", "offset": a, "length": b - a}
              for r, (a, b) in zip(order, bounds)]
    rng.shuffle(chunks)
    files = {c["file"]: whole[c["offset"]:c["offset"] + c["length"]].clone() for c in chunks}
    return whole, {"numel": numel, "chunks": chunks}, files


def _needed(metadata, start, end):
    return {c["file"] for c in metadata["chunks"]
            if c["offset"] < end and start < c["offset"] + c["length"]}


@fresh_cases
def check_load_my_shard(load_my_shard, timeout=CHECK_TIMEOUT_S, *, rng):
    """load_my_shard(metadata, files) -> this rank's (L_r,) piece of the whole, on m ranks."""
    __tracebackhide__ = True
    expect_callable(load_my_shard, "load_my_shard")
    for _ in range(2):
        n, m = rng.sample([2, 3, 4], 2)
        numel = rng.randrange(5, 40)
        if numel % m == 0:
            numel += 1  # uneven: tensor_split gives the first ranks one value more
        whole, metadata, files = draw_checkpoint(rng, n, numel)
        where = f"load_my_shard: {numel} values saved by {n} ranks, loaded on {m}"
        outcomes = run_on_ranks(load_my_shard, [(metadata, files)] * m, exercise="load_my_shard",
                                where=where, hint=HINT, harness=load_in_rank,
                                guard=ANSWERS.in_rank, timeout=timeout)
        pieces = torch.tensor_split(whole, m)
        start = 0
        for rank, ((got, reads), _) in enumerate(outcomes):
            end = start + len(pieces[rank])
            expect_tensor(got, pieces[rank], where=where + f" (this rank's [{start}, {end}))",
                          rank=rank, hint=HINT)
            extra = sorted(set(reads) - _needed(metadata, start, end))
            if extra:
                fail(where, rank, f"read {', '.join(extra)}, which hold nothing of [{start}, {end})",
                     "find the chunks that overlap this rank's piece from the metadata alone, "
                     "and read only those")
            start = end
    print("load_my_shard: passed (two drawn checkpoints of uneven chunks, resharded onto another "
          "number of ranks: every rank's piece exact, only overlapping chunks read)")
