"""Ring reduce-scatter, all-gather and all-reduce, built from send/recv (lesson 02).

The n ranks of a group form a ring: rank r sends to r + 1 and receives from r - 1. A tensor is
cut into n chunks, chunk c ending on rank c. At every step each rank sends one chunk to the right
and receives one from the left, so all n links are busy at once and none carries more than one
chunk per step:

    reduce-scatter  n - 1 steps: chunk c travels once around the ring, each rank on the way adding
                    its own copy, and arrives complete at rank c.
    all-gather      n - 1 steps: each complete chunk travels around the ring and is copied.
    all-reduce      reduce-scatter, then all-gather: 2(n - 1) steps; each rank sends
                    2(n - 1)/n of the tensor whatever n is (`cost.ALGORITHMS`).

When n does not divide a tensor, `torch.tensor_split` makes the first chunks one element longer;
every rank cuts the same way, so sender and receiver always agree on a chunk's size.

Each function has the signature and in-place contract of torch's op of the same name, and takes
the `group` to run on (None: the default group) like torch. They run to completion in the
calling thread (there is no async_op).
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import recorded
from dlcourse.collectives.p2p import (
    check_contiguous,
    check_op,
    combine_into,
    finish,
    nbytes_of,
    rank_in,
    ring_neighbours,
    scratch,
)

ReduceOp = dist.ReduceOp

# How this ring differs from the textbook loop of one `exchange` per step (the exercise): like
# gloo's own ring, it posts receives ahead and cuts big chunks into pieces, so that adding one
# piece overlaps receiving the next, and it adds partial sums in place, so that it needs only
# IN_FLIGHT small buffers (fresh memory costs a page fault per 4 KB on first touch). Measured on
# a quiet 2-core machine, 4 ranks, 16 MB (benchmarks/collectives.py): pieces of 4 MB, so one
# per chunk and no overlap, 1.29-1.33x gloo's time; 2 MB 1.18x; 1 MB 1.13-1.19x.
SEGMENT_BYTES = 1 << 20  # the most one message carries; a bigger chunk goes as several pieces
IN_FLIGHT = 3  # reduce-scatter receives posted ahead of the one being added


def ring_all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """Like `dist.all_reduce`: every rank's `tensor` becomes the reduction of all of them, in place.

    Any shape and floating dtype; any numel (chunks differ by one element when n does not divide).
    """
    for _ in ring_all_reduce_steps(tensor, op, group):
        pass


def ring_all_reduce_steps(tensor, op=ReduceOp.SUM, group=None):
    """`ring_all_reduce` one step at a time: yields a `RingStep` after each of the 2(n - 1) steps,
    so that lesson 02's widget can show what every rank holds in between."""
    who = "ring_all_reduce"
    rank, world_size = rank_in(group, who)
    check_op(op, who)
    check_contiguous(tensor, "tensor", who)
    chunks = tensor.view(-1).tensor_split(world_size)  # views: (ceil or floor of numel/n,) each
    with recorded("all_reduce", nbytes_of(tensor), world_size, "ring"):
        yield from _reduce_scatter(chunks, op, rank, world_size, group)
        yield from _all_gather(chunks, rank, world_size, group)


def ring_reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None):
    """Like `dist.reduce_scatter`: output = input_list[rank] reduced over the group's ranks.

    input_list: one tensor per rank, read and never written; entry c is the chunk that ends on
    rank c. Entries may differ in shape (uneven chunks) but must match across ranks.
    output: shaped like input_list[rank]; it may be input_list[rank] itself.
    """
    who = "ring_reduce_scatter"
    rank, world_size = rank_in(group, who)
    check_op(op, who)
    _check_list(input_list, world_size, "input_list", who)
    _check_like(output, input_list[rank], f"output must be shaped like input_list[{rank}]", who)
    with recorded("reduce_scatter", nbytes_of(input_list), world_size, "ring"):
        partials = [t.clone() for t in input_list]  # the ring adds into these, in place
        for _ in _reduce_scatter(partials, op, rank, world_size, group):
            pass
        output.copy_(partials[rank])


def ring_all_gather(tensor_list, tensor, group=None):
    """Like `dist.all_gather`: tensor_list[c] = rank c's `tensor`, on every rank.

    Entries may differ in shape (rank c's tensor shaped like tensor_list[c]), which torch's gloo
    all_gather does not allow.
    """
    who = "ring_all_gather"
    rank, world_size = rank_in(group, who)
    _check_list(tensor_list, world_size, "tensor_list", who)
    _check_like(tensor, tensor_list[rank], f"tensor must be shaped like tensor_list[{rank}]", who)
    with recorded("all_gather", nbytes_of(tensor_list), world_size, "ring"):
        tensor_list[rank].copy_(tensor)
        for _ in _all_gather(tensor_list, rank, world_size, group):
            pass


def ring_reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None):
    """Like `dist.reduce_scatter_single` (`reduce_scatter_tensor` before torch 2.13): `input`
    holds n equal chunks one after another (dim 0 concatenated or stacked), and rank r's
    `output` becomes chunk r reduced over the ranks."""
    who = "ring_reduce_scatter_tensor"
    rank, world_size = rank_in(group, who)
    check_contiguous(input, "input", who)
    _check_sizes(input.numel(), world_size, output.numel(), "input", "output", who,
                 list_form="ring_reduce_scatter")
    chunks = [c.view(output.shape) for c in input.view(-1).split(output.numel())]
    ring_reduce_scatter(output, chunks, op, group)


def ring_all_gather_into_tensor(output_tensor, input_tensor, group=None):
    """Like `dist.all_gather_single` (`all_gather_into_tensor` before torch 2.13): output_tensor
    holds every rank's input_tensor, in rank order (dim 0 concatenated or stacked)."""
    who = "ring_all_gather_into_tensor"
    rank, world_size = rank_in(group, who)
    check_contiguous(output_tensor, "output_tensor", who)
    numel = input_tensor.numel()
    _check_sizes(output_tensor.numel(), world_size, numel, "output_tensor", "input_tensor", who,
                 list_form="ring_all_gather")
    chunks = [c.view(input_tensor.shape) for c in output_tensor.view(-1).split(numel)]
    ring_all_gather(chunks, input_tensor, group)


@dataclass
class RingStep:
    """What one rank did in one step of a ring (what `ring_all_reduce_steps` yields)."""

    phase: str  # "reduce-scatter" or "all-gather"
    step: int  # 0 .. n - 2 within the phase
    sent: int  # index of the chunk sent to the right
    received: int  # index of the chunk received from the left
    holds: torch.Tensor  # what this rank now holds for chunk `received` (the chunk itself)


def _reduce_scatter(chunks, op, rank, world_size, group):
    """The reduce-scatter phase, in place: chunks[rank] ends as the reduction over the ring, the
    other chunks hold partial sums. A generator: yields a RingStep after each step."""
    if world_size == 1:  # a ring of one: nothing to send
        finish(chunks[rank], op, world_size)
        return
    right, left = ring_neighbours(rank, world_size, group)
    # Chunk c starts at rank c + 1 and travels right, each rank adding its own copy, so that it
    # arrives complete at rank c after n - 1 steps. Rank r therefore first sends its chunk r - 1
    # as it is, and at step k receives rank r - 1's partial of chunk r - k - 2, adds its own copy
    # in place and sends the sum on at step k + 1; the last chunk to arrive is chunk r itself.
    arriving = [(rank - step - 2) % world_size for step in range(world_size - 1)]
    pieces, count = _cut(chunks)
    messages = [(step, c, p) for step, c in enumerate(arriving) for p in range(count)]
    # A partial lands in one of IN_FLIGHT slots of one buffer. Receives are posted ahead, so a
    # message is taken the moment it comes; a slot is free again once its partial is added.
    slot_numel = max(piece.numel() for chunk in pieces for piece in chunk)
    slots = scratch(IN_FLIGHT * slot_numel, chunks[0]).split(slot_numel)

    def receive(m):  # message m carries tag m
        step, c, p = messages[m]
        return dist.irecv(slots[m % IN_FLIGHT][: pieces[c][p].numel()], left, group, tag=m)

    receives = [receive(m) for m in range(min(IN_FLIGHT, len(messages)))]
    sends = [dist.isend(piece, right, group, tag=p)
             for p, piece in enumerate(pieces[(rank - 1) % world_size])]
    for m, (step, c, p) in enumerate(messages):
        receives[m].wait()
        mine = pieces[c][p]
        combine_into(mine, mine, slots[m % IN_FLIGHT][: mine.numel()], op)
        if m + IN_FLIGHT < len(messages):
            receives.append(receive(m + IN_FLIGHT))
        if c != rank:  # pass the partial on: it is message m + count for the next rank
            sends.append(dist.isend(mine, right, group, tag=m + count))
        if p == count - 1:  # the whole chunk is in
            if c == rank:
                finish(chunks[rank], op, world_size)
            yield RingStep("reduce-scatter", step, (rank - step - 1) % world_size, c, chunks[c])
    for work in sends:
        work.wait()


def _all_gather(chunks, rank, world_size, group):
    """The all-gather phase: chunks[rank] is complete here; after n - 1 steps every chunk is,
    each received straight into its place. A generator: yields a RingStep after each step."""
    if world_size == 1:
        return
    right, left = ring_neighbours(rank, world_size, group)
    # Rank r first passes on its own chunk, then at each step the chunk that just arrived:
    # step k brings chunk r - k - 1, which rank r - 1 received the step before.
    arriving = [(rank - step - 1) % world_size for step in range(world_size - 1)]
    pieces, count = _cut(chunks)
    messages = [(step, c, p) for step, c in enumerate(arriving) for p in range(count)]
    # Every message has its own place to land, so every receive is posted at once.
    receives = [dist.irecv(pieces[c][p], left, group, tag=m)
                for m, (step, c, p) in enumerate(messages)]
    sends = [dist.isend(piece, right, group, tag=p) for p, piece in enumerate(pieces[rank])]
    for m, (step, c, p) in enumerate(messages):
        receives[m].wait()
        if step < world_size - 2:  # the last chunk to arrive has already been everywhere else
            sends.append(dist.isend(pieces[c][p], right, group, tag=m + count))
        if p == count - 1:
            yield RingStep("all-gather", step, (rank - step) % world_size, c, chunks[c])
    for work in sends:
        work.wait()


def _cut(chunks):
    """Cut every chunk into the same number of pieces of at most SEGMENT_BYTES.

    Returns (pieces, count): pieces[c] is a list of `count` flat views of chunks[c]. Chunk sizes
    are the same on every rank, so sender and receiver cut a chunk alike.
    """
    biggest = max(c.numel() for c in chunks) * chunks[0].element_size()
    count = max(1, math.ceil(biggest / SEGMENT_BYTES))
    return [c.view(-1).tensor_split(count) for c in chunks], count


def _check_list(tensors, world_size, what, who):
    if not isinstance(tensors, (list, tuple)) or len(tensors) != world_size:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(
            f"{who}: {what} must hold one tensor per rank of the group ({world_size}), got {got}"
        )
    for i, t in enumerate(tensors):
        check_contiguous(t, f"{what}[{i}]", who)
        if t.dtype != tensors[0].dtype or t.device != tensors[0].device:
            raise ValueError(f"{who}: {what}[{i}] is {t.dtype} on {t.device} but {what}[0] is "
                             f"{tensors[0].dtype} on {tensors[0].device}; make them all alike")


def _check_like(tensor, like, message, who):
    if tensor.shape != like.shape or tensor.dtype != like.dtype:
        raise ValueError(
            f"{who}: {message}: got {tuple(tensor.shape)} {tensor.dtype}, "
            f"expected {tuple(like.shape)} {like.dtype}"
        )
    check_contiguous(tensor, "the tensor", who)


def _check_sizes(whole, world_size, part, whole_name, part_name, who, list_form):
    if whole != world_size * part:
        raise ValueError(
            f"{who}: {whole_name} must have world_size x {part_name}.numel() = {world_size} x "
            f"{part} = {world_size * part} elements, got {whole}. For chunks of unequal size use "
            f"the list form, {list_form}."
        )

