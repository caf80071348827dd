"""Issue 36: under `dlcourse grade` the answers are absent from a graded rank, not refused there.

A set that declares its rank-side code (`Answers(rank_side=...)`: every set, 01 to 11, each of
its exercises) has none of its answer modules in a graded rank (`dlcourse/grading/absent.py`):
not in `sys.modules`, not in `gc`, not importable (with the finder taken off `sys.meta_path`
an import statement is refused by an audit hook, and `importlib` finds no file to load or is
refused its `open`), and a copy of their text exec'd is refused by fingerprint. Each way a student's
function looks for the library's answer below finds nothing and fails; the solutions pass
graded. The notebook's self-check still refuses in-process (the checks' own tests)."""

import json
from pathlib import Path

import pytest

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.checkpoint import check_is_complete, check_load_my_shard, check_resume_state
from dlcourse.checks.collectives import check_all_reduce_time, check_ring_all_gather
from dlcourse.checks.combine import check_first_stage_activation_bytes
from dlcourse.checks.context import check_seq_to_heads
from dlcourse.checks.core import Submitted
from dlcourse.checks.data import check_accumulate_step, check_all_reduce_buckets
from dlcourse.checks.debug import check_first_divergence
from dlcourse.checks.expert import check_dispatch_to_experts, check_route_with_capacity
from dlcourse.checks.memory import check_zero_model_state
from dlcourse.checks.pipeline import check_bubble_fraction
from dlcourse.checks.tensor import check_column_parallel_linear
from dlcourse.checks.zero import check_zero_bytes_per_rank, check_zero_step
from dlcourse.grading import absent

ROOT = Path(__file__).resolve().parent.parent
ULYSSES = ROOT / "dlcourse" / "parallel" / "context" / "ulysses.py"
ULYSSES_TEXT = ULYSSES.read_text()  # what a student could paste into a notebook cell
COST_TEXT = (ROOT / "dlcourse" / "collectives" / "cost.py").read_text()
RESUME_TEXT = (ROOT / "dlcourse" / "checkpoint" / "resume.py").read_text()


def graded(fn, name):
    return Submitted(name, pickling.dumps(fn))


def _found(answer):
    if answer is None:
        raise LookupError("found nothing")
    return answer


def from_sys_modules(x, group):
    import sys
    module = sys.modules.get("dlcourse.parallel.context.ulysses")
    return _found(getattr(module, "_seq_to_heads", None))(x, group)


def from_import_module(x, group):
    import importlib
    return importlib.import_module("dlcourse.parallel.context.ulysses")._seq_to_heads(x, group)


def from_gc(x, group):
    import gc
    import types
    answer = next((o for o in gc.get_objects() if isinstance(o, types.FunctionType)
                   and o.__name__ == "_seq_to_heads" and o.__module__.startswith("dlcourse.")),
                  None)
    return _found(answer)(x, group)


def with_the_finder_taken_off(x, group):
    import importlib
    import sys
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Finder"]
    return importlib.import_module("dlcourse.parallel.context.ulysses")._seq_to_heads(x, group)


def from_the_file(x, group):
    import importlib.util
    import dlcourse
    path = Path(dlcourse.__file__).parent / "parallel" / "context" / "ulysses.py"
    spec = importlib.util.spec_from_file_location("copy_of_ulysses", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._seq_to_heads(x, group)


def from_the_folder(x, group):  # a path relative to a folder's descriptor, which no event names
    import os
    import dlcourse
    folder = os.open(str(Path(dlcourse.__file__).parent / "parallel" / "context"), os.O_RDONLY)
    text = os.read(os.open("ulysses.py", os.O_RDONLY, dir_fd=folder), 1 << 20).decode()
    namespace = {"__name__": "renamed"}
    exec(text.replace("_seq_to_heads", "mine"), namespace)  # renamed: no fingerprint knows it
    return namespace["mine"](x, group)


def from_a_pasted_copy(x, group, text=ULYSSES_TEXT):
    namespace = {"__name__": "pasted"}
    exec(compile(text, "pasted.py", "exec"), namespace)
    return namespace["_seq_to_heads"](x, group)


MISSING = "No module named 'dlcourse.parallel.context' here: it answers the exercise"
# With the finder taken off, `importlib.import_module` (which raises no `import` audit event)
# finds no file where the rank sandbox bound /dev/null over them (a device, not a module), and
# is refused the file's `open` where there is no rank sandbox.
NOT_FOUND = ("No module named 'dlcourse.parallel.context.ulysses'", "open ")


@pytest.mark.parametrize("wrong, says", [
    (from_sys_modules, "raised LookupError: found nothing"),
    (from_import_module, MISSING),
    (from_gc, "raised LookupError: found nothing"),
    (with_the_finder_taken_off, NOT_FOUND),
    (from_the_file, "open "),
    (from_the_folder, "open 'ulysses.py'"),
    (from_a_pasted_copy, "from a copy of the library's answer to the exercise being graded")],
    ids=["sys.modules", "import_module", "gc", "finder off", "file", "dir_fd", "pasted copy"])
def test_a_graded_rank_has_no_answer_to_find(wrong, says):
    first, _ = first_line_and_hint(check_seq_to_heads, graded(wrong, "seq_to_heads"))
    assert any(said in first for said in ([says] if isinstance(says, str) else says)), first


def _solution(notebook, name):
    """The solution notebook's function `name`, defined as the notebook defines it (by value)."""
    namespace = {"__name__": f"solution_{name}"}
    for cell in json.loads((ROOT / "solutions" / notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "check_" not in source:
            exec(compile(source, notebook, "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("notebook, name, check", [
    ("08_context_parallel.ipynb", "seq_to_heads", check_seq_to_heads),
    ("09_experts.ipynb", "dispatch_to_experts", check_dispatch_to_experts),
    # a graded rank's /tmp is its own: the checkpoint folders are sent to it as data
    ("11_checkpoints.ipynb", "is_complete", check_is_complete),
    # their ranks load the counter and the run without the cost model and the resume
    ("02_collectives.ipynb", "all_reduce_time", check_all_reduce_time),
    ("11_checkpoints.ipynb", "resume_state", check_resume_state)],
    ids=["08", "09", "11", "02 cost", "11 resume"])
def test_the_solutions_pass_graded_with_the_answers_absent(notebook, name, check, capsys):
    check(graded(_solution(notebook, name), name))  # 2 to 5 ranks: it raises if any fails
    assert "passed" in capsys.readouterr().out


def dispatch_from_the_library(x, experts, n_experts, group):
    import importlib
    for name in ("dlcourse.parallel.expert", "dlcourse.checks.expert.reference"):
        importlib.import_module(name)
    raise AssertionError("imported an answer module in a graded rank")


def test_lesson_09s_answers_and_references_are_absent_too():
    first, _ = first_line_and_hint(check_dispatch_to_experts,
                                   graded(dispatch_from_the_library, "dispatch_to_experts"))
    assert "No module named 'dlcourse.parallel.expert' here" in first, first


def test_a_copy_is_told_by_its_code_whatever_its_file_name():
    code = compile(ULYSSES_TEXT, str(ULYSSES), "exec")
    pasted = compile(ULYSSES_TEXT, "pasted.py", "exec")
    of = {c.co_name: absent.fingerprint(c) for c in code.co_consts if hasattr(c, "co_code")}
    assert of and of == {c.co_name: absent.fingerprint(c) for c in pasted.co_consts
                         if hasattr(c, "co_code")}
    edited = ULYSSES_TEXT.replace("recv = torch.empty_like(send)",
                                  "recv = 1 * torch.empty_like(send)")
    changed = compile(edited, "pasted.py", "exec")  # one line of _seq_to_heads changed
    assert of != {c.co_name: absent.fingerprint(c) for c in changed.co_consts
                  if hasattr(c, "co_code")}


def looking_for(modules):
    """A student's function (any arguments) that looks for `modules` in its rank's memory and
    through the import system, and says what it found: a graded rank must have none."""
    def probe(*args, **kwargs):
        import gc
        import importlib
        import sys
        import types
        under = lambda name: any(name == m or name.startswith(m + ".") for m in modules)  # noqa
        found = sorted({n for n in sys.modules if under(n)} | {
            o.__module__ for o in gc.get_objects()
            if isinstance(o, types.FunctionType) and under(o.__module__ or "")})
        for name in modules:
            try:
                importlib.import_module(name)
                found.append(f"imported {name}")
            except ImportError:
                pass
        raise LookupError(f"found {found}" if found else "found nothing")
    return probe


# Each covered set, one check of it, and its answer modules: the lesson's code, the references,
# lesson 10's finders (its catalogue's runs are in the rank, refused there: `debug.answers.ANSWERS`).
SETS = {
    "04": (check_column_parallel_linear, ("dlcourse.parallel.tensor",
                                          "dlcourse.checks.tensor.column_parallel_linear")),
    "01": (check_zero_model_state, ("dlcourse.memory", "dlcourse.checks.memory.zero_model_state")),
    "02": (check_ring_all_gather, ("dlcourse.checks.collectives.rings",
                                   "dlcourse.checks.collectives.ring_all_gather")),
    # the counter, which core and the rings import, without the alpha-beta model (`bus.py`)
    "02 cost": (check_all_reduce_time, ("dlcourse.collectives.cost",
                                        "dlcourse.checks.collectives.all_reduce_time")),
    "03": (check_all_reduce_buckets, ("dlcourse.parallel.data",
                                      "dlcourse.checks.data.all_reduce_buckets",
                                      "dlcourse.checks.data.replicas")),
    # its ranks wrap the model in the lesson's DataParallel: train_step refused there, the
    # checks' modules absent
    "03 accumulate": (check_accumulate_step, ("dlcourse.checks.data.accumulate_step",
                                              "dlcourse.checks.data.replicas")),
    "05": (check_zero_step, ("dlcourse.parallel.zero", "dlcourse.checks.zero.cases",
                             "dlcourse.checks.zero.zero_step")),
    "05 bytes": (check_zero_bytes_per_rank, ("dlcourse.memory", "dlcourse.parallel.zero",
                                             "dlcourse.checks.zero.zero_bytes_per_rank")),
    "06": (check_bubble_fraction, ("dlcourse.parallel.pipeline",
                                   "dlcourse.checks.pipeline.schedule_1f1b")),
    "07": (check_first_stage_activation_bytes, (
        "dlcourse.parallel.grid", "dlcourse.parallel.rules", "dlcourse.parallel.combine",
        "dlcourse.planner", "dlcourse.parallel.pipeline.schedules", "dlcourse.memory",
        "dlcourse.checks.combine")),
    "08": (check_seq_to_heads, ("dlcourse.parallel.context",
                                "dlcourse.checks.context.reference")),
    "09": (check_route_with_capacity, ("dlcourse.moe", "dlcourse.parallel.expert",
                                       "dlcourse.checks.expert.reference")),
    "10": (check_first_divergence, ("dlcourse.debug.divergence", "dlcourse.debug.compare",
                                    "dlcourse.debug.hang", "dlcourse.parallel.tensor.grads",
                                    "dlcourse.checks.debug.reference")),
    # the run a resume saves (`checkpoint/run.py`) without the resume, its files or the finder
    "11 resume": (check_resume_state, ("dlcourse.checkpoint.resume", "dlcourse.checkpoint.files",
                                       "dlcourse.checks.checkpoint.resume_state")),
    "11": (check_load_my_shard, ("dlcourse.checkpoint.resume", "dlcourse.checkpoint.files",
                                 "dlcourse.checkpoint.reshard",
                                 "dlcourse.checks.checkpoint.load_my_shard")),
}


@pytest.mark.parametrize("lesson", SETS)
def test_each_covered_set_s_answers_are_absent_from_its_graded_ranks(lesson):
    check, modules = SETS[lesson]
    first, _ = first_line_and_hint(check, graded(looking_for(modules), "probe"))
    assert "raised LookupError: found nothing" in first, first


# The two answers a package of the library used to import with it (`dlcourse.collectives`'s
# `cost.py`, `dlcourse.checkpoint`'s `resume.py`): absent from a graded rank too, by import or
# by a copy of their text pasted into the notebook.

def time_from_the_library(nbytes, world_size, alpha, beta):
    from dlcourse.collectives import predict_time
    return predict_time("ring all_reduce", nbytes, world_size, alpha, beta)


def time_from_a_pasted_copy(nbytes, world_size, alpha, beta, text=COST_TEXT):
    namespace = {"__name__": "pasted"}
    exec(compile(text, "pasted.py", "exec"), namespace)
    return namespace["predict_time"]("ring all_reduce", nbytes, world_size, alpha, beta)


COPY = "from a copy of the library's answer to the exercise being graded"


def resume_from_the_library(run):
    from dlcourse.checkpoint import resume_state
    return resume_state(run)


def resume_from_a_pasted_copy(run, text=RESUME_TEXT):
    namespace = {"__name__": "pasted"}
    exec(compile(text, "pasted.py", "exec"), namespace)
    return namespace["resume_state"](run)


@pytest.mark.parametrize("check, wrong, says", [
    (check_all_reduce_time, time_from_the_library,
     "No module named 'dlcourse.collectives.cost' here"),
    (check_all_reduce_time, time_from_a_pasted_copy, COPY),
    (check_resume_state, resume_from_the_library,
     "No module named 'dlcourse.checkpoint.resume' here"),
    (check_resume_state, resume_from_a_pasted_copy, COPY)],
    ids=["02 import", "02 pasted", "11 import", "11 pasted"])
def test_the_cost_model_and_the_resume_are_absent_from_their_graded_ranks(check, wrong, says):
    first, _ = first_line_and_hint(check, graded(wrong, wrong.__name__.split("_from")[0]))
    assert says in first, first
