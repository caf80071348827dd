"""Which tokens each rank of a context-parallel group holds (lesson 08,
`lessons/08_context_parallel.ipynb`).

The sequence (s tokens) is cut into equal chunks and every rank keeps some of them:

    contiguous  cp chunks of s/cp; rank i holds chunk i.
    zigzag      2·cp chunks of s/(2·cp); rank i holds chunks i and 2·cp-1-i.

With a causal mask a query sees only keys at or before it, so with contiguous chunks rank 0's
queries see one chunk of keys and rank cp-1's see all cp: the last rank does cp times the first
rank's work. Zig-zag pairs an early chunk with a late one, and every rank does the same work
(`causal_work`). It is the layout of torch's `_HeadTailLoadBalancer` (torch 2.13,
`distributed/tensor/experimental/_context_parallel/_load_balancer.py`, the default of its
`context_parallel` when 2·cp divides s) and of Megatron-Core's context parallelism; Striped
Attention (Brandon et al. 2023) balances by dealing tokens round-robin instead. The layouts are
a table (`LAYOUTS`), so a student can print them and add one.

    layout = Layout("zigzag", cp=4, seq_len=16)
    layout.chunks(1)               # [1, 6]
    layout.positions(1)            # tensor([2, 3, 12, 13]): global token positions on rank 1
    x_local = layout.shard(x, 1)   # (b, s, ...) -> (b, s/cp, ...), no communication
    layout.unshard([x0, x1, x2, x3])  # the ranks' shards -> the whole (b, s, ...)
"""

from dataclasses import dataclass

import torch

# layout -> (chunks the sequence is cut into for cp ranks, the chunks rank r holds in order)
LAYOUTS = {
    "contiguous": (lambda cp: cp, lambda cp, r: [r]),
    "zigzag": (lambda cp: 2 * cp, lambda cp, r: [r, 2 * cp - 1 - r]),
}


@dataclass(frozen=True)
class Layout:
    name: str  # a key of LAYOUTS: "contiguous" or "zigzag"
    cp: int  # ranks in the context-parallel group
    seq_len: int  # s: tokens in the whole sequence

    def __post_init__(self):
        if self.name not in LAYOUTS:
            raise ValueError(f"unknown layout {self.name!r}; one of {sorted(LAYOUTS)}")
        for field in ("cp", "seq_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout.{field} must be a whole number >= 1, got {value!r}")
        n = self.n_chunks
        if self.seq_len % n:
            raise ValueError(f"{self.name} layout: {n} chunks (cp {self.cp}) do not divide the "
                             f"sequence of {self.seq_len} tokens ({self.seq_len} / {n} = "
                             f"{self.seq_len / n:g}); use a sequence length that is a multiple "
                             f"of {n}")

    @property
    def n_chunks(self):
        return LAYOUTS[self.name][0](self.cp)

    @property
    def chunk_len(self):
        return self.seq_len // self.n_chunks

    def chunks(self, rank):
        """The chunk indices rank `rank` holds, in the order they sit in its local tensor."""
        if not 0 <= rank < self.cp:
            raise ValueError(f"rank {rank} is not in a group of cp = {self.cp} ranks")
        return LAYOUTS[self.name][1](self.cp, rank)

    def positions(self, rank, device=None):
        """Global positions (s/cp,) of the tokens rank `rank` holds, in local order."""
        c = self.chunk_len
        return torch.cat([torch.arange(i * c, (i + 1) * c, device=device)
                          for i in self.chunks(rank)])

    def shard(self, x, rank, dim=1):
        """This rank's tokens of a whole tensor (dim `dim` is the sequence): (b, s, ...) ->
        (b, s/cp, ...). A copy, so the shard does not keep the whole tensor alive."""
        self._check_len(x.size(dim))
        pieces = x.chunk(self.n_chunks, dim=dim)
        return torch.cat([pieces[i] for i in self.chunks(rank)], dim=dim)

    def unshard(self, shards, dim=1):
        """Every rank's shard, in rank order -> the whole tensor, tokens in global order."""
        if len(shards) != self.cp:
            raise ValueError(f"unshard needs one shard per rank ({self.cp}), got {len(shards)}")
        pieces = [None] * self.n_chunks
        for rank, shard in enumerate(shards):
            held = self.chunks(rank)
            for i, piece in zip(held, shard.chunk(len(held), dim=dim)):
                pieces[i] = piece
        return torch.cat(pieces, dim=dim)

    def _check_len(self, n):
        if n != self.seq_len:
            raise ValueError(f"this layout is for {self.seq_len} tokens, the tensor has {n}")


def causal_work(layout):
    """Per rank, the (query chunk, key chunk) pairs it computes under a causal mask: the pairs in
    which some query may see some key (query chunk >= key chunk). One pair is chunk_len² scores.

        contiguous: rank i computes i + 1 pairs of (s/cp)²      -> the last rank cp x the first
        zigzag:     every rank computes 2·cp + 1 pairs of (s/(2cp))²
    """
    return [sum(q >= k for q in layout.chunks(r) for k in range(layout.n_chunks))
            for r in range(layout.cp)]


def causal_scores(layout):
    """Per rank, the query-key scores it computes under a causal mask (whole chunk pairs,
    the diagonal pairs computed in full and masked): `causal_work` x chunk_len²."""
    return [pairs * layout.chunk_len ** 2 for pairs in causal_work(layout)]
