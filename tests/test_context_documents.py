"""Lesson 08's document-mask counts (`dlcourse/parallel/context/documents.py`) against
independent references: the per-document zig-zag against torch 2.13's own
`_PerDocumentHeadTailLoadBalancer`, the kept scores against the mask written out token by
token, and the plain causal mask's counts against `causal_scores`."""

import pytest
import torch

from dlcourse.parallel.context import Layout
from dlcourse.parallel.context.documents import (document_causal, document_ids, kept_scores,
                                                 per_document_head_tail, per_document_zigzag,
                                                 ranks_needed)


@pytest.mark.parametrize("lengths, cp", [([16], 2), ([8, 16, 8], 2), ([24, 8, 16], 4)])
def test_per_document_head_tail_is_torchs_balancer(lengths, cp):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer)
    order = _PerDocumentHeadTailLoadBalancer([lengths], cp, "cpu")._generate_indices()[0]
    assert [p.tolist() for p in per_document_head_tail(lengths, cp)] == \
        [c.tolist() for c in order.chunk(cp)]


def test_per_document_zigzag_gives_every_rank_a_head_and_tail_of_every_document():
    # documents of 8 and 4 tokens, cp = 2: chunks of 2 and 1 tokens
    assert [p.tolist() for p in per_document_zigzag([8, 4], 2)] == [[0, 1, 6, 7, 8, 11],
                                                                    [2, 3, 4, 5, 9, 10]]


@pytest.mark.parametrize("layout", [per_document_zigzag, per_document_head_tail])
def test_one_document_is_the_zigzag_layout(layout):
    ours = layout([32], 4)
    assert all(torch.equal(p, Layout("zigzag", 4, 32).positions(r)) for r, p in enumerate(ours))


def test_kept_scores_count_the_mask_token_by_token():
    lengths, cp = [8, 4, 4], 2
    doc = [d for d, n in enumerate(lengths) for _ in range(n)]
    positions = per_document_zigzag(lengths, cp)
    want = [sum(1 for i in p.tolist() for j in range(16) if j <= i and doc[i] == doc[j])
            for p in positions]
    assert kept_scores(positions, document_causal(document_ids(lengths))) == want


def test_a_rank_needs_only_the_ranks_holding_its_documents():
    # contiguous, cp = 4, documents of 8 and 8 tokens: ranks 0-1 hold the first, 2-3 the second
    positions = [Layout("contiguous", 4, 16).positions(r) for r in range(4)]
    needed = ranks_needed(positions, document_causal(document_ids([8, 8])))
    assert needed == [[0], [0, 1], [2], [2, 3]]


def test_a_document_that_does_not_cut_into_chunks_is_refused():
    with pytest.raises(ValueError, match="does not cut into 2·cp = 4 chunks"):
        per_document_zigzag([6], 2)
