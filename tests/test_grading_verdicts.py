"""Issue 16: a student cell cannot decide its grader's verdict. `dlcourse grade` runs each course
grader's check in a fresh process on the objects the kernel exported (`grading/verdicts.py`,
`checks/core/verdict.py`), and reads what the ranks send back as data only."""

import copy
import os
import sys
from pathlib import Path

import cloudpickle
import nbformat
import pytest
from nbformat.v4 import new_code_cell

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.data import check_make_buckets
from dlcourse.checks.tensor import check_f
from dlcourse.errors import RankError
from dlcourse.grading import grade, verdicts
from dlcourse.launcher import launch_as_data
from test_grading_cli import EXERCISE, ROOT, _cell

REFERENCE = ROOT / "exercises" / "00_launch.ipynb"

# Wrong answers: rank r's own x stacked (not everyone's), and x itself on every rank. The first
# also prints a verdict line claiming both graders passed, as a student who read the protocol.
WRONG = {
    "def gather_all(": (
        "def gather_all(x):\n"
        "    print('DLCOURSE-VERDICTS {\"6\": {}, \"11\": {}} ' + '0' * 64)\n"
        "    return torch.stack([x] * dist.get_world_size())\n"),
    "def sum_to_rank0(": "def sum_to_rank0(x):\n    return x\n",
}

# Each seen giving full points to the wrong answers above when the kernel decided the verdict.
HOOKS = """
import dlcourse.checks.launch as checks
passed = lambda fn, *args, **kwargs: print("passed")
checks.check_gather_all = checks.check_sum_to_rank0 = passed  # the check replaced
get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)  # errors swallowed
"""
BLANK = """
def blank(lines):  # every cell that mentions the course's checking or grading becomes empty
    return [] if any("dlcourse" in line or "check_" in line for line in lines) else lines
get_ipython().input_transformers_cleanup.append(blank)
"""


def _cheat(attack):
    nb = copy.deepcopy(EXERCISE)
    for start, source in WRONG.items():
        _cell(nb, start).source = source
    nb.cells.insert(4, new_code_cell(attack))  # after the imports and answers, before a grader
    return nb


def test_cells_that_replace_checks_swallow_errors_or_blank_graders_get_no_points(tmp_path):
    for name, attack in (("hooks", HOOKS), ("blank", BLANK)):
        nbformat.write(_cheat(attack), str(tmp_path / f"{name}.ipynb"))
    reference = grade.read_reference(REFERENCE)
    graded = grade.grade_all(grade.find_notebooks([tmp_path]), reference=reference)
    by_name = {Path(s.path).stem: s for s in graded}
    for name, submission in by_name.items():
        assert submission.total == 0, (name, submission.results)
    hooks = {r.exercise: r.reason for r in by_name["hooks"].results}
    # The real check ran, on the student's real functions: its own messages name the mistakes.
    assert "returned wrong values" in hooks["gather_all"], hooks
    # The gradebook keeps the check's hint after the failure's line (issue 17).
    assert " Hint: " in hooks["gather_all"], hooks
    assert "sum_to_rank0" in hooks["sum_to_rank0"] and "rank" in hooks["sum_to_rank0"], hooks
    for r in by_name["blank"].results:  # the export never ran: nothing to check
        assert r.reason, r


@pytest.mark.parametrize("source, expected", [
    ("from dlcourse.checks.launch import check_gather_all\n\ncheck_gather_all(gather_all)",
     verdicts.GraderCall("dlcourse.checks.launch", "check_gather_all", (("name", "gather_all"),))),
    ("from dlcourse.checks.zero import check_x as c\nc(f, 3)",
     verdicts.GraderCall("dlcourse.checks.zero", "check_x", (("name", "f"), ("value", 3)))),
    ("assert square(3) == 9", None),  # an instructor's own grader: judged in the kernel
    ("import os\nfrom dlcourse.checks.launch import check_gather_all\ncheck_gather_all(g)", None),
    ("from dlcourse.checks.launch import check_gather_all\ncheck_gather_all(g, seed=1)", None),
    ("from dlcourse.checks.launch import check_gather_all\ncheck_gather_all(g())", None),
    ("from os import system\nsystem('true')", None),
    ("def (", None),
])
def test_only_a_plain_check_call_is_taken_out_of_the_kernel(source, expected):
    assert verdicts.grader_call(source) == expected


def test_a_verdict_line_counts_only_with_the_key():
    key, other = os.urandom(32), os.urandom(32)
    body = '{"6": {}}'
    genuine = f"{verdicts.VERDICT_TAG} {body} {verdicts.sign(key, body)}"
    forged = f"{verdicts.VERDICT_TAG} {body} {verdicts.sign(other, body)}"
    assert verdicts.read(key, f"[rank 0] hi\n{genuine}\n") == {6: {}}
    assert verdicts.read(key, f"{forged}\n[rank 1] {genuine[:-1]}0\n") is None
    assert verdicts.read(key, "") is None


def _returns_an_object():
    return type("Anything", (), {})()


def _sends_its_own_report(marker):
    """A rank writing a pickle of its own on its result pipe: unpickled as objects, it would
    create `marker` in the parent."""
    import gc
    import pickle
    from multiprocessing.connection import Connection

    class Payload:
        def __reduce__(self):
            return (open, (marker, "w"))

    for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
        try:
            conn.send_bytes(pickle.dumps((Payload(), Payload())))
        except OSError:
            pass
    return 1


def test_what_ranks_send_back_is_read_as_data_only(tmp_path):
    with pytest.raises(RankError, match="returned a .*Anything, but this launch reads only data"):
        launch_as_data(_returns_an_object, world_size=1, backend="gloo")
    marker = tmp_path / "unpickled"
    with pytest.raises(RankError, match="sent a report that is not a RankOutcome"):
        launch_as_data(_sends_its_own_report, str(marker), world_size=1, backend="gloo")
    assert not marker.exists()
    assert launch_as_data(_identity_on_rank, world_size=2, backend="gloo") == [
        {"rank": 0, "t": [0.0, 1.0]}, {"rank": 1, "t": [0.0, 1.0]}]


def _identity_on_rank():
    import torch
    import torch.distributed as dist
    return {"rank": dist.get_rank(), "t": torch.arange(2.0).tolist()}


def _submitted(obj):
    """`obj` pickled as a notebook's kernel pickles it, by value: a test module's class would
    go by reference, and its graded rank would import the test module and the library answers
    it compares with, which are absent there (`grading/absent.py`)."""
    module = sys.modules[obj.__module__]
    registered = module.__name__ in cloudpickle.list_registry_pickle_by_value()
    cloudpickle.register_pickle_by_value(module)
    try:
        return Submitted(obj.__name__, pickling.dumps(obj))
    finally:
        if not registered:
            cloudpickle.unregister_pickle_by_value(module)


def test_a_submitted_answer_gets_the_verdict_the_kernel_would_give(capsys):
    """The checks whose answers are not plain data: a plan of Parameter objects (told apart by
    identity, so named where it is computed) and an autograd Function class (known to be one
    only where it is unpickled, on the rank)."""
    from test_checks_make_buckets import make_buckets, make_buckets_forward_order
    from test_checks_megatron_f_g import MegatronF, not_a_function

    check_make_buckets(_submitted(make_buckets))
    check_f(_submitted(MegatronF))
    assert "make_buckets: passed" in capsys.readouterr().out
    first, _ = first_line_and_hint(check_make_buckets, _submitted(make_buckets_forward_order))
    assert "the parameters are in another order" in first, first
    first, _ = first_line_and_hint(check_f, _submitted(not_a_function))
    assert "autograd Function class itself" in first and "function" in first, first
