"""Checks for lesson 10's exercises (`exercises/10_debugging.ipynb`): the two finders of
`dlcourse/debug/` by hand, on real runs; the fix of one bug they find; a bug drawn at random
named from its run; the fix of another; and the flight recorder's dumps of a hung job read by
hand.

    check_first_divergence(first_divergence)   the first tensor where a rank's run parts from one
                                               process, rounding not counted
    check_mismatched_call(mismatched_call)     from per-rank collective traces of a hang, the rank
                                               and the call that the others do not make
    check_sync_sequence_parallel_grads(sync_sequence_parallel_grads)
                                               the fix of the catalogue's `sp_layernorm_grads`,
                                               on 2 and 3 ranks, against one process
    check_name_the_bug(name_the_bug)           a run with a catalogue bug drawn at random: its
                                               first place and the bug's key
    check_sync_tied_grads(sync_tied_grads)     the fix of `pp_tied_embeddings_unsynced`, on 2 and
                                               3 pipeline stages, against one process
    check_waited_call(waited_call)             from every rank's flight-recorder dump of a hung
                                               job, the rank waited on and the call waited in

    runs.py       the traces: real 2-rank runs with a bug of the catalogue, a real 4-rank job
    first_divergence.py, mismatched_call.py, sync_sequence_parallel_grads.py, name_the_bug.py,
    sync_tied_grads.py, waited_call.py   the six checks, one module each, named after it
    reference.py  the answers, from the lesson's own finders, after the student's function returns
    answers.py    what is refused while a student's code runs

Every check draws its cases afresh on each run and names the seed with a failure; `seed=`
draws the same cases again.
"""

from dlcourse.checks.debug.first_divergence import check_first_divergence
from dlcourse.checks.debug.mismatched_call import check_mismatched_call
from dlcourse.checks.debug.name_the_bug import check_name_the_bug
from dlcourse.checks.debug.sync_sequence_parallel_grads import check_sync_sequence_parallel_grads
from dlcourse.checks.debug.sync_tied_grads import check_sync_tied_grads
from dlcourse.checks.debug.waited_call import check_waited_call

__all__ = ["check_first_divergence", "check_mismatched_call", "check_sync_sequence_parallel_grads",
           "check_name_the_bug", "check_sync_tied_grads", "check_waited_call"]
