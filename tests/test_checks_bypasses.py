"""A determined student's ways around the refusals (issue: graders a student cannot get around):
the library's answer reached through an alias held elsewhere, a default argument, a copied
function object, another library function that computes the same thing, and a collective issued
through the process group's own methods. Each must be refused like the plain call."""

import sys
import types

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import dlcourse.memory
from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.context import check_seq_to_heads
from dlcourse.checks.core import CheckFailed, Submitted
from dlcourse.checks.debug import check_name_the_bug
from dlcourse.checks.data import check_broadcast_parameters, check_make_buckets
from dlcourse.checks.launch import check_sum_to_rank0
from dlcourse.checks.memory import check_count_params, check_zero_model_state
from dlcourse.memory import model_state_bytes
from dlcourse.memory.calculator import ModelSpec, spec_params
from dlcourse.parallel.data.buckets import make_buckets as library_make_buckets
from dlcourse.parallel.data.steps import broadcast_parameters as library_broadcast

TOOLS = {"state": model_state_bytes}  # an alias the name-based refusal never looked into
COPY = types.FunctionType(model_state_bytes.__code__, model_state_bytes.__globals__,
                          "my_state_bytes", model_state_bytes.__defaults__)
COPY.__kwdefaults__ = model_state_bytes.__kwdefaults__


def _as_dict(parts):
    return {"params": parts.params, "grads": parts.grads, "optimizer": parts.optimizer}


def zero_through_a_dict(n_params, dp, zero_stage, mixed_precision):
    return _as_dict(TOOLS["state"](n_params, dp=dp, zero_stage=zero_stage,
                                   mixed_precision=mixed_precision))


def zero_through_a_default(n_params, dp, zero_stage, mixed_precision, _state=model_state_bytes):
    return _as_dict(_state(n_params, dp=dp, zero_stage=zero_stage,
                           mixed_precision=mixed_precision))


def zero_through_a_copy(n_params, dp, zero_stage, mixed_precision):
    return _as_dict(COPY(n_params, dp=dp, zero_stage=zero_stage, mixed_precision=mixed_precision))


def zero_through_the_calculator(n_params, dp, zero_stage, mixed_precision):
    # memory_per_gpu computes the same parts for a ModelSpec; reached by attribute
    spec = ModelSpec("x", 1, 1, 1, 1, 1, 1, 1, False, False, True, False)
    parts = dlcourse.memory.calculator.model_state_bytes(n_params, dp=dp, zero_stage=zero_stage,
                                                         mixed_precision=mixed_precision)
    return _as_dict(parts) if spec else None


@pytest.mark.parametrize("wrong", [zero_through_a_dict, zero_through_a_default,
                                   zero_through_a_copy, zero_through_the_calculator])
def test_the_zero_formula_is_refused_however_it_is_reached(wrong):
    with pytest.raises(CheckFailed, match="called model_state_bytes from dlcourse.memory, "
                                          "which this exercise does not allow"):
        check_zero_model_state(wrong)
    assert model_state_bytes(10, dp=2, zero_stage=3).params == 10  # put back afterwards


def count_through_a_model_spec(config):  # lesson 01's calculator counts the same GPT shape
    spec = ModelSpec("course", config.n_layers, config.hidden, config.n_heads,
                     config.vocab_size, config.seq_len, 4 * config.hidden, config.n_heads,
                     False, config.bias, config.tie_embeddings, True)
    return spec_params(spec)


def test_another_library_function_counting_the_same_parameters_is_refused():
    with pytest.raises(CheckFailed, match="called spec_params from dlcourse.memory"):
        check_count_params(count_through_a_model_spec)


def sum_through_the_process_group(x):  # ProcessGroup.allreduce, not dist.all_reduce
    total = x.clone()
    dist.group.WORLD.allreduce([total]).wait()
    return total if dist.get_rank() == 0 else None


def test_a_collective_issued_through_the_process_group_is_refused_like_dist_s():
    with pytest.raises(CheckFailed, match=r"rank \d called all_reduce \(through the process "
                                          r"group\), which this exercise does not allow"):
        check_sum_to_rank0(sum_through_the_process_group)


def broadcast_through_a_default(model, group, _answer=library_broadcast):
    _answer(model, group)


BUCKETS_COPY = types.FunctionType(library_make_buckets.__code__, library_make_buckets.__globals__)


def make_buckets_through_a_copy(model, bucket_cap_mb):  # copied before the check ran
    return [b.params for b in BUCKETS_COPY(model, bucket_cap_mb)]


def make_buckets_copied_while_it_runs(model, bucket_cap_mb):  # the name now holds the refusal
    copy = types.FunctionType(library_make_buckets.__code__, library_make_buckets.__globals__)
    return [b.params for b in copy(model, bucket_cap_mb)]


def test_lesson_03s_answers_are_refused_in_the_ranks_and_here_through_a_default_or_a_copy():
    with pytest.raises(CheckFailed, match="called broadcast_parameters from dlcourse.parallel"):
        check_broadcast_parameters(broadcast_through_a_default)
    for wrong in (make_buckets_through_a_copy, make_buckets_copied_while_it_runs):
        with pytest.raises(CheckFailed, match="called make_buckets from dlcourse.parallel"):
            check_make_buckets(wrong)


def test_an_honest_answer_that_merely_uses_torch_still_passes(capsys):
    def sum_to_rank0(x):
        total = x.clone()
        dist.reduce(total, dst=0)
        return total if dist.get_rank() == 0 else None

    check_sum_to_rank0(sum_to_rank0)
    assert "sum_to_rank0: passed" in capsys.readouterr().out
    assert torch.equal(torch.ones(1), torch.ones(1))


def gather_from_a_table(x):
    """No communication: rebuild every rank's x from the inputs the check once used (fixed
    seeds 100 x case + rank for its fixed cases), as a student who read the check could."""
    from dlcourse.checks.core import random_tensor
    from dlcourse.checks.launch.gather_all import GATHER_CASES
    n = dist.get_world_size()
    case = next(i for i, (ws, shape, dtype) in enumerate(GATHER_CASES)
                if ws == n and tuple(shape) == tuple(x.shape) and dtype == x.dtype)
    return torch.stack([random_tensor(x.shape, x.dtype, seed=100 * case + r) for r in range(n)])


def test_inputs_drawn_afresh_defeat_a_table_of_the_checks_old_inputs():
    from dlcourse.checks.launch import check_gather_all
    with pytest.raises(CheckFailed) as failed:
        check_gather_all(gather_from_a_table)
    message = str(failed.value)
    assert "returned wrong values" in message.splitlines()[0] or "raised StopIteration" in message
    assert "cases drawn from seed" in message and "check_gather_all(your_function, seed=" in message


def test_the_same_seed_draws_the_same_cases(capsys):
    from dlcourse.checks.memory import check_zero_model_state

    def zero_model_state(n_params, dp, zero_stage, mixed_precision):
        per_param = (2, 2, 12) if mixed_precision else (4, 4, 8)
        parts = dict(zip(("params", "grads", "optimizer"), (b * n_params for b in per_param)))
        for part in ("optimizer", "grads", "params")[:zero_stage]:
            parts[part] /= dp
        return parts

    seen = []
    for _ in range(2):
        calls = []
        check_zero_model_state(lambda *a: calls.append(a) or zero_model_state(*a), seed=1234)
        seen.append(calls)
    check_zero_model_state(lambda *a: seen.append(a) or zero_model_state(*a))  # a fresh seed
    assert seen[0] == seen[1] and len(seen[0]) == 12
    assert seen[2:] != seen[0]


def step_all_reduces_every_grad(model, optimizer, x, y, loss_fn, group):  # even None ones
    optimizer.zero_grad()
    n = torch.tensor([float(len(x))])
    dist.all_reduce(n, group=group)
    (loss_fn(model(x), y) * (len(x) / n.item())).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)
    optimizer.step()


def test_a_none_gradient_given_to_a_collective_is_named_on_the_first_line():
    from dlcourse.checks.data import check_data_parallel_step
    with pytest.raises(CheckFailed) as failed:
        check_data_parallel_step(step_all_reduces_every_grad)
    first = str(failed.value).splitlines()[0]
    assert "raised TypeError: dist.all_reduce was given None instead of a tensor: a " \
           "parameter's .grad is None until backward computes one" in first


def test_a_function_listed_twice_is_given_back_its_own_code():
    from dlcourse.checks.core.refuse import refusal, replaced
    code = model_state_bytes.__code__
    stand_in = refusal("model_state_bytes", "twice")
    with replaced([], [(model_state_bytes, stand_in), (model_state_bytes, stand_in)]):
        assert model_state_bytes.__code__ is not code
    assert model_state_bytes.__code__ is code


# Issue 36: a copy of the library's file read and exec'd. In the notebook's self-check the copy is
# refused when called (and with the refusing hook switched off it ran, the known bypass); under
# `dlcourse grade` a rank has no module that answers the exercise (`Answers(rank_side=)`,
# `dlcourse/grading/absent.py`) and cannot read their files (`rank_sandbox.py`), so there is
# nothing to copy.

def seq_to_heads_from_the_file(x, group):
    import dlcourse.parallel.context.ulysses as library
    namespace = {"__name__": "copy"}
    with open(library.__file__) as f:
        exec(compile(f.read(), "copy.py", "exec"), namespace)
    return namespace["_seq_to_heads"](x, group)


def test_an_execd_copy_of_the_answer_finds_no_module_to_read_under_grading():
    with pytest.raises(CheckFailed) as failed:
        check_seq_to_heads(Submitted("seq_to_heads", pickling.dumps(seq_to_heads_from_the_file)))
    first = str(failed.value).splitlines()[0]
    assert "raised ModuleNotFoundError: No module named 'dlcourse.parallel.context.ulysses' " \
        "here: it answers the exercise being graded" in first, first


# Issue 36: the copy-refusing profile hook switched off, or the original's code found in memory,
# in the notebook's own self-check too: an audit hook (`core/audit.py`), which cannot be removed,
# refuses ctypes, sys.setprofile and a function made of a refused original's code while the
# student's function runs. Before it, each of these passed the check.

def _execd_copy():
    import dlcourse.memory.accounting as library
    namespace = {"__name__": "copy"}
    with open(library.__file__) as f:
        exec(compile(f.read(), "copy.py", "exec"), namespace)
    return namespace["model_state_bytes"]


def zero_with_ctypes_then_a_copy(n_params, dp, zero_stage, mixed_precision):
    import ctypes
    ctypes.pythonapi.PyEval_SetProfile(None, None)
    return _as_dict(_execd_copy()(n_params, dp=dp, zero_stage=zero_stage,
                                  mixed_precision=mixed_precision))


def zero_with_cprofile_then_a_copy(n_params, dp, zero_stage, mixed_precision):
    import cProfile
    cProfile.Profile().enable()  # its profiler replaces the check's
    return _as_dict(_execd_copy()(n_params, dp=dp, zero_stage=zero_stage,
                                  mixed_precision=mixed_precision))


def zero_from_the_code_found_in_memory(n_params, dp, zero_stage, mixed_precision):
    import gc
    code = next(o for o in gc.get_objects() if isinstance(o, tuple) and len(o) == 2
                and isinstance(o[0], types.CodeType) and o[0].co_name == "model_state_bytes")[0]
    original = types.FunctionType(code, dlcourse.memory.accounting.__dict__)
    return _as_dict(original(n_params, dp=dp, zero_stage=zero_stage,
                             mixed_precision=mixed_precision))


@pytest.mark.parametrize("wrong, says", [
    (zero_with_ctypes_then_a_copy, "used ctypes.dlsym, which no exercise allows"),
    (zero_with_cprofile_then_a_copy, "used sys.setprofile, which no exercise allows"),
    (zero_from_the_code_found_in_memory, "called model_state_bytes from dlcourse.memory")])
def test_switching_the_refusal_off_is_refused_in_the_self_check_too(wrong, says):
    with pytest.raises(CheckFailed, match=says):
        check_zero_model_state(wrong)
    assert sys.getprofile() is None  # the check's own hook put back as it was
    assert model_state_bytes(10, dp=2, zero_stage=3).params == 10


# Issue 36: name_the_bug read from rank 0's traces only passed whenever the draw lacked the bug
# that parts first on rank 1 (about 6 runs in 10); every draw has it now, so a fresh draw fails.

def test_naming_the_bug_from_rank_0_alone_fails_on_every_draw():
    import test_checks_debug_naming as naming_tests
    cloudpickle.register_pickle_by_value(naming_tests)  # as conftest does for this module
    try:
        first, _ = first_line_and_hint(check_name_the_bug, naming_tests.rank_zero_only)
    finally:
        cloudpickle.unregister_pickle_by_value(naming_tests)
    assert "rank 0's first place, but rank 1 parts earlier" in first, first  # a fresh draw
