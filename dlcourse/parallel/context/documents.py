"""Document masks under context parallelism, counted (lesson 08, `lessons/08_context_parallel
.ipynb`, Step 5).

A packed training sequence holds several documents back to back, and a document mask lets a
token see only the earlier tokens of its own document: the causal mask, cut into diagonal blocks
one document long. Llama 3 trained its long-context stage with one (Dubey et al. 2024, §3.3.2,
its reason to gather K and V rather than pass them round a ring). Nothing is timed here: the
functions count what each rank's queries keep and whose keys they need.

    positions = per_document_zigzag([8, 4, 4], cp=2)  # each rank's global positions, (n,) each
    seen = document_causal(document_ids([8, 4, 4]))  # seen(q_pos, k_pos) -> (n, m) bool
    kept_scores(positions, seen)                    # per rank, the (query, key) scores kept
    ranks_needed(positions, seen)                   # per rank, the ranks whose K/V it needs
    per_document_head_tail([8, 4, 4], cp=2)         # torch 2.13's per-document balancer

The zig-zag layout balances the causal mask because every query row grows by one key per
token; a document mask restarts that growth at each document, so a layout blind to documents
is balanced again only by chance. Two ways to balance inside documents: every rank takes a head
and a tail chunk of every document (`per_document_zigzag`), or, as torch 2.13's
`_PerDocumentHeadTailLoadBalancer` does (`_context_parallel/_load_balancer.py`, checked in
`tests/test_context_documents.py`), each document is reordered head-tail and the reordered
sequence is then cut into cp contiguous shards (`per_document_head_tail`), so a short document
may land on one rank whole.
"""

import torch


def document_ids(lengths):
    """(s,) the document of every token of a sequence packed from documents of `lengths`."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def document_causal(doc_ids):
    """The document mask as a function of global positions: query i sees key j when j <= i and
    both are in the same document."""
    def seen(q_pos, k_pos):  # (n,), (m,) -> (n, m) bool
        same = doc_ids[q_pos][:, None] == doc_ids[k_pos][None, :]
        return same & (q_pos[:, None] >= k_pos[None, :])
    return seen


def kept_scores(positions, seen):
    """Per rank, the scores its queries keep under `seen`: positions[r] (n,) are rank r's."""
    keys = torch.cat(list(positions))  # every token, each once
    return [int(seen(p, keys).sum()) for p in positions]


def ranks_needed(positions, seen):
    """Per rank, the ranks holding a key that one of its queries sees (itself included)."""
    return [[o for o, k in enumerate(positions) if bool(seen(p, k).any())] for p in positions]


def _head_tail(start, n, cp):
    """A document of n tokens from `start`, cut into 2·cp chunks: per rank, chunks r and
    2·cp - 1 - r."""
    if n % (2 * cp):
        raise ValueError(f"a document of {n} tokens does not cut into 2·cp = {2 * cp} chunks "
                         f"({n} / {2 * cp} = {n / (2 * cp):g}); pad it to a multiple of {2 * cp}")
    chunks = torch.arange(start, start + n).chunk(2 * cp)
    return [torch.cat([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)]


def per_document_head_tail(lengths, cp):
    """Per rank, its global positions under torch's per-document head-tail balancer: each
    document reordered rank by rank (head and tail chunk), the documents one after another, and
    that order cut into cp equal contiguous shards."""
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    order = torch.cat([t for start, n in zip(starts, lengths) for t in _head_tail(start, n, cp)])
    return list(order.chunk(cp))


def per_document_zigzag(lengths, cp):
    """Per rank, its global positions when every document is cut into 2·cp chunks and rank r
    takes chunks r and 2·cp - 1 - r of each (the zig-zag layout, document by document)."""
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    pieces = [_head_tail(start, n, cp) for start, n in zip(starts, lengths)]  # [doc][rank]
    return [torch.cat([doc[r] for doc in pieces]) for r in range(cp)]
