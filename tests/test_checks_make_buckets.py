"""Lesson 03's check of make_buckets (`dlcourse/checks/data/make_buckets.py`): the solutions pass,
and the wrong answers students write fail with a message naming the case, the rank, the parameter,
expected vs got, and a hint that says which mistake it was."""

import pytest

from checking import first_line_and_hint as _first_line_and_hint
from checking import starts as _starts
from dlcourse.checks.data import check_make_buckets
from dlcourse.parallel.data.buckets import make_buckets as library_make_buckets

# --- exercise 3: make_buckets ---------------------------------------------------------------

def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _greedy(params, close):
    """Pack params in order; close(bytes so far) says when a bucket is full."""
    buckets, current, size = [], [], 0
    for p in params:
        current.append(p)
        size += p.numel() * p.element_size()
        if close(size):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def make_buckets(model, bucket_cap_mb):
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(_trainable(model)), lambda size: size >= cap)


def make_buckets_forward_order(model, bucket_cap_mb):
    cap = bucket_cap_mb * 2**20
    return _greedy(_trainable(model), lambda size: size >= cap)


def make_buckets_strictly_over(model, bucket_cap_mb):  # > where the lesson closes at >=
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(_trainable(model)), lambda size: size > cap)


def make_buckets_in_megabytes(model, bucket_cap_mb):  # 10**6 bytes, not 2**20
    cap = bucket_cap_mb * 10**6
    return _greedy(reversed(_trainable(model)), lambda size: size >= cap)


def make_buckets_four_bytes_each(model, bucket_cap_mb):  # assumes float32 everywhere
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        current.append(p)
        size += 4 * p.numel()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def make_buckets_at_most_the_cap(model, bucket_cap_mb):  # never over the cap: closes early
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    return buckets + ([current] if current else [])


def make_buckets_drops_the_last(model, bucket_cap_mb):  # the last, partly full bucket is lost
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets


def make_buckets_tied_twice(model, bucket_cap_mb):  # every name, the tied matrix twice
    cap = bucket_cap_mb * 2**20
    params = [p for _, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    return _greedy(reversed(params), lambda size: size >= cap)


def make_buckets_with_frozen(model, bucket_cap_mb):  # requires_grad ignored
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(list(model.parameters())), lambda size: size >= cap)


def make_buckets_one_per_parameter(model, bucket_cap_mb):  # the cap ignored
    return [[p] for p in reversed(_trainable(model))]


def make_buckets_of_names(model, bucket_cap_mb):  # names instead of the parameters
    names = {p: n for n, p in model.named_parameters()}
    return [[names[p] for p in bucket] for bucket in make_buckets(model, bucket_cap_mb)]


def make_buckets_with_the_library(model, bucket_cap_mb):
    return [bucket.params for bucket in library_make_buckets(model, bucket_cap_mb)]


GPT_PLAN = ("make_buckets(model, bucket_cap_mb=0.001) of the tied GPT in float32, a cap of "
            "1,048.6 bytes: ")
FULL_PLAN = ("make_buckets(model, bucket_cap_mb=0.000118256) of the MLP in float32, a cap of "
             "124.0 bytes: ")
F64_PLAN = ("make_buckets(model, bucket_cap_mb=0.00019) of the MLP in float64, a cap of 199.2 "
            "bytes: ")


def test_make_buckets_solution_passes(capsys):
    check_make_buckets(make_buckets)
    assert "make_buckets: passed on 6 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (make_buckets_forward_order, GPT_PLAN + "the parameters are in another order: number 0 of "
                                            "the plan is tok_emb.weight, expected ln_f.bias",
     "from the last to the first of model.parameters()"),
    (make_buckets_strictly_over, FULL_PLAN + "bucket 0 goes on past the cap: it held 124 bytes, "
                                             "at least the cap of 124.0, once it had 2.bias, "
                                             "but you close it later, at 320 bytes",
     "124 bytes is exactly the cap, and a bucket that reaches it is full (>=, not >)"),
    (make_buckets_in_megabytes, F64_PLAN + "bucket 0 closes at 192 bytes after 4.weight, below "
                                           "the cap of 199.2 bytes",
     "bucket_cap_mb is in MiB, 2**20 bytes (not 10**6)"),
    (make_buckets_four_bytes_each, F64_PLAN + "bucket 0 goes on past the cap: it held 248 bytes",
     "p.numel() * p.element_size() each"),
    (make_buckets_at_most_the_cap, GPT_PLAN + "bucket 0 closes at 96 bytes after "
                                              "blocks.0.mlp.proj.bias, below the cap",
     "keep adding parameters until the bucket holds at least the cap"),
    (make_buckets_drops_the_last, GPT_PLAN + "parameter blocks.0.ln1.bias is in no bucket (nor "
                                             "are 3 more)",
     "after the loop, add the last bucket even if it holds less than the cap"),
    (make_buckets_tied_twice, GPT_PLAN + "the plan holds tok_emb.weight 2 times (lm_head.weight "
                                         "is tok_emb.weight: one Parameter used twice",
     "not from every module or named_parameters(remove_duplicate=False)"),
    (make_buckets_with_frozen, "make_buckets(model, bucket_cap_mb=0) of the MLP with idle "
                               "parameters in float32, a cap of 0.0 bytes: the plan holds frozen, "
                               "which has requires_grad=False",
     "leave out every p without p.requires_grad"),
    (make_buckets_one_per_parameter, GPT_PLAN + "bucket 0 closes at 32 bytes after ln_f.bias, "
                                                "below the cap of 1,048.6 bytes",
     "keep adding parameters until the bucket holds at least the cap"),
    (make_buckets_of_names, GPT_PLAN + "bucket 0 holds a str, which is not one of the model's "
                                       "parameters",
     "put the Parameter objects themselves in the buckets"),
    (make_buckets_with_the_library, GPT_PLAN + "called make_buckets from "
                                               "dlcourse.parallel.data.buckets, which this "
                                               "exercise does not allow", ""),
])
def test_make_buckets_rejects_plausible_wrong_answers(wrong, says, hint):
    first, got_hint = _first_line_and_hint(check_make_buckets, wrong)
    assert _starts(first, says)
    assert hint in got_hint
