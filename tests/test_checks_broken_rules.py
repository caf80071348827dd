"""Lesson 07's check of broken_rules (`dlcourse/checks/combine/broken_rules.py`): a correct answer
written without the library passes, the wrong answers students write fail naming the rule, and
the runtime's own rule book (the grader's reference) is refused while the answer runs."""

import pytest

from dlcourse.checks.combine import check_broken_rules
from dlcourse.checks.core import CheckFailed


def broken(model, grid, micro_batches, *, kv_strict=False, layers_per_stage=False,
           cp_chunks=2, interleave_any_m=False):
    a, kv, layers = model["n_heads"], model["kv_heads"], model["n_layers"]
    tp, pp, v, cp, m = grid["tp"], grid["pp"], grid["v"], grid["cp"], micro_batches
    found = []
    if a % tp:
        found.append("tp divides the heads")
    if kv % tp and (kv_strict or tp % kv):
        found.append("tp and the K/V heads")
    if pp > layers:
        found.append("a layer a stage at least")
    if (v > 1 or layers_per_stage) and layers % (pp * v):
        found.append("whole layers per virtual stage")
    if pp > 1 and m < pp:
        found.append("micro-batches fill the pipeline")
    if v > 1 and (pp == 1 or (m % pp and not interleave_any_m)):
        found.append("interleaved micro-batches")
    if cp > 1 and model["seq_len"] % (cp_chunks * cp):
        found.append("cp splits the sequence")
    return found


def broken_as_a_set(model, grid, micro_batches):  # another valid shape of the answer
    return {name for name in broken(model, grid, micro_batches)}


@pytest.mark.parametrize("answer", [broken, broken_as_a_set])
def test_correct_answers_pass(answer, capsys):
    check_broken_rules(answer)
    assert "broken_rules: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, says", [
    (dict(kv_strict=True), "tp and the K/V heads"),  # replication forgotten
    (dict(layers_per_stage=True), "whole layers per virtual stage"),  # uneven stages refused
    (dict(cp_chunks=1), "cp splits the sequence"),  # cp chunks, not the zig-zag's 2 cp
    (dict(interleave_any_m=True), "interleaved micro-batches"),
])
def test_wrong_answers_fail_naming_the_rule(mistake, says):
    with pytest.raises(CheckFailed) as failed:
        check_broken_rules(lambda model, grid, m: broken(model, grid, m, **mistake))
    assert says in str(failed.value)


def test_the_runtime_rule_book_is_refused():
    def from_the_library(model, grid, micro_batches):
        from types import SimpleNamespace
        from dlcourse.parallel.grid import RankGrid
        from dlcourse.parallel.rules import RULES, Run
        g = RankGrid(dp=grid["dp"], cp=grid["cp"], tp=grid["tp"], pp=grid["pp"], virtual=grid["v"])
        return [r.name for r in RULES if r.broken(g, SimpleNamespace(**model), Run(micro_batches))]
    with pytest.raises(CheckFailed):
        check_broken_rules(from_the_library)
