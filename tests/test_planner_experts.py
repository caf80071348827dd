"""The planner for mixtures of experts (issue 34): the expert axis of the one grid description
(`RankGrid.ep`), its rows in the rule book, and `dlcourse plan --ep`."""

import pytest

from dlcourse.cli import main
from dlcourse.models import GPTConfig, MoEConfig
from dlcourse.parallel.expert.groups import ep_layout
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.rules import problems

MOE = MoEConfig(vocab_size=64, seq_len=16, hidden=32, n_layers=2, n_heads=4, n_experts=8,
                top_k=2)


def test_the_expert_data_parallel_group_is_lesson_09s_when_ep_borrows_from_dp():
    """tp = cp = 1: the grid's expert-data-parallel size is lesson 09's EDP groups' size."""
    for dp, ep in ((4, 2), (8, 8), (8, 1), (6, 3)):
        edp_groups = ep_layout(dp, ep)[1]
        assert RankGrid(dp=dp, ep=ep).expert_data_parallel == len(edp_groups[0])
    # torchtitan's efsdp = dp_shard x cp x tp / ep: ep may borrow cp and tp ranks too
    assert RankGrid(dp=2, cp=2, tp=4, ep=8).expert_data_parallel == 2
    assert RankGrid(dp=2, ep=2).experts_per_rank(MOE.n_experts) == 4


@pytest.mark.parametrize("grid,needle", [
    (RankGrid(dp=4, ep=8), "ep 8 does not divide the dp 4 x cp 1 x tp 1 = 4 ranks"),
    (RankGrid(dp=6, ep=3), "ep 3 does not divide the 8 experts (8 / 3 = 2.66667)"),
    (RankGrid(dp=3, tp=2, ep=4), "ep 4 does not divide the dp 3 x cp 1 x tp 2 = 6 ranks"),
])
def test_the_rule_book_refuses_a_bad_ep_with_the_arithmetic(grid, needle):
    found = problems(grid, MOE, where="megatron")
    assert any(needle in p for p in found), found


def test_ep_on_a_dense_model_and_in_the_combined_grid_are_refused():
    dense = GPTConfig(vocab_size=64, seq_len=16, hidden=32, n_layers=2, n_heads=4)
    assert any("needs a mixture-of-experts model" in p
               for p in problems(RankGrid(dp=2, ep=2), dense, where="megatron"))
    good = RankGrid(dp=2, cp=2, tp=2, ep=8)  # torchtitan's rule: 8 divides 2 x 2 x 2
    assert problems(good, MOE, where="megatron") == []
    assert any("not built in the combined grid" in p for p in problems(good, MOE))
    with pytest.raises(ValueError, match="whole number >= 1"):
        RankGrid(dp=2, ep=0)


@pytest.mark.parametrize("ep,needle", [("0", "--ep takes"), ("two", "--ep takes"),
                                       ("2", "has no experts")])
def test_plan_gives_a_bad_ep_one_line(capsys, ep, needle):
    code = main(["plan", "--model", "llama-2-7b", "--gpus", "8", "--tokens-per-step", "1M",
                 "--ep", ep])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and needle in err, err
