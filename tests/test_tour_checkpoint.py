"""The tour's row of lesson 11 (issue 37): a rank SIGKILLed mid-run, the job relaunched and resumed
from the last checkpoint, equal bit for bit (float64) to the same run never killed; run after the
tour's shared job, in launches of its own (`own_job`), so the shared job's rows still come back.
A resume that forgets torch's generator state (`run_with_restarts(forget=("rng",))`: the residual
dropouts draw other masks) must make the same row report a mismatch."""

from dataclasses import replace
from functools import partial

import pytest

from dlcourse import tour
from dlcourse.debug import SUBJECTS, find_divergence
from dlcourse.strategies import CATALOGUE, TourConfig
from dlcourse.strategies.checkpoint import kill_row

NAME = "TP + kill a rank, resume from checkpoint (lesson 11)"
SHARED = "DP naive (lesson 03)"


def _run(rows, world_size=2):
    said = []
    table = tour.run(world_size=world_size, steps=2, backend="gloo", rows=rows, out=said.append)
    return {row["strategy"]: row for row in table}, "\n".join(map(str, said))


def test_the_killed_run_resumes_equal_to_the_uninterrupted_one_beside_a_shared_job_row():
    table, printed = _run([CATALOGUE[SHARED], CATALOGUE[NAME]])
    shared, killed = table[SHARED], table[NAME]
    assert shared["matches"] and shared["ranks"] == 2  # the shared job was not killed
    assert killed["matches"] and killed["max |Δ| vs reference"] == 0.0
    assert killed["ranks"] == 2 and killed["model-state bytes/rank"] > 0
    # kill before step 6, checkpoints after 3 and 6: steps 4 and 5 trained twice, one restart
    assert "1 restart, 2 steps redone" in killed["note"]
    assert f"note: {NAME}: 1 restart" in printed
    assert list(table).index(NAME) > list(table).index(SHARED)  # after the shared job


def test_a_resume_that_forgets_the_generator_state_is_reported_as_a_mismatch():
    broken = replace(CATALOGUE[NAME], own_job=partial(kill_row, forget=("rng",)))
    row = _run([broken])[0][NAME]
    assert not row["matches"] and row["max |Δ| vs reference"] > 1e-6, row


def test_the_row_runs_at_its_own_world_size_and_is_no_finder_subject():
    entry = CATALOGUE[NAME]
    said = []
    assert tour._runnable([entry], TourConfig(), 4, said.append) == [entry] and said == []
    assert NAME not in SUBJECTS and not entry.finder
    assert all(name in SUBJECTS for name, s in CATALOGUE.items() if s.finder)
    with pytest.raises(ValueError, match="is no subject of the finder: a rank killed"):
        find_divergence(NAME)  # one clear line, before any rank starts
