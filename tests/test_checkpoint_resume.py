"""Lesson 11: what a resume needs (dlcourse/checkpoint/resume.py), checked on 2 real ranks against
a run that never stopped, with lesson 10's divergence finder naming where a forgetful one parts."""

import pytest

from dlcourse.checkpoint import PIECES
from dlcourse.debug.forgetting import resume_divergences


@pytest.fixture(scope="module")
def resumes():
    forgets = [()] + [(p,) for p in PIECES]
    return dict(zip(forgets, resume_divergences(forgets, k=3, n=2)))


def test_the_complete_resume_equals_the_run_that_never_stopped_bit_for_bit(resumes):
    first, final = resumes[()]
    assert first is None
    assert final == 0.0  # float64, the same operations in the same order: not one bit differs


# where each forgotten piece first shows (k = 3: step 4 is the first resumed step)
EXPECTED = {
    "model": (4, "parameters before the step", None),
    "optimizer": (4, "parameters after the step", None),
    # the optimizer's param_groups carry step 3's learning rate, so the first resumed step is
    # right; the fresh schedule then sets step 5's from its own count: one step later
    "scheduler": (5, "parameters after the step", None),
    "rng": (4, "activations", "blocks.0.attn.resid_dropout"),
    "tracker": (4, "activations", "blocks.0.attn.attn_dropout"),
    "data": (4, "activations", "tok_emb"),
}


@pytest.mark.parametrize("piece", PIECES)
def test_each_forgotten_piece_is_named_by_the_divergence_finder(resumes, piece):
    first, final = resumes[(piece,)]
    step, phase, name = EXPECTED[piece]
    assert first is not None and final > 1e-6
    assert (first.step, first.phase) == (step, phase), str(first)
    if name:
        assert first.name == name, str(first)
    assert first.ranks == [0, 1]
