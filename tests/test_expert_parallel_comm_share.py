"""`compare.communication_share` (lesson 09, Step 6) times an EP step beside its collectives
replayed alone. The replay must be the step's collectives: on 2 real gloo ranks, `CommCounter`
records the same ops in the same order around the replay as around the step, each at least the
size the step sent (uneven all-to-alls: the largest over the ranks), and the step's calls are
what the lesson says: per MoE block the counts' all-gather and 5 all-to-alls (counts, dispatch
and combine forward, both again backward), one all-reduce per dense gradient."""

import torch.distributed as dist

import dlcourse
from dlcourse.collectives.counter import CommCounter
from dlcourse.models import MoEConfig, MoEGPT, moe_loss, synthetic_tokens
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.expert import average_gradients, expert_parallel, expert_parameters
from dlcourse.parallel.expert.compare import agreed_sizes, communication_share, replay

CFG = MoEConfig(vocab_size=32, seq_len=8, n_heads=4, hidden=16, n_experts=4, top_k=2,
                n_layers=2)


def on_two_ranks():
    group = dist.group.WORLD
    model = expert_parallel(MoEGPT(CFG), group)
    x, y = shard_batch(synthetic_tokens(4, CFG, seed=1), group)
    with CommCounter() as step:
        moe_loss(model, model(x), y).backward()
        average_gradients(model, group)
    calls = agreed_sizes(step.records, group)
    with CommCounter() as again:
        replay(calls, group)
    share = communication_share(CFG, synthetic_tokens(4, CFG, seed=1), group, rounds=1)
    experts = {id(p) for p in expert_parameters(model)}
    dense = sum(1 for p in model.parameters() if id(p) not in experts)
    return ([(r.op, r.nbytes) for r in step.records], [(r.op, r.nbytes) for r in again.records],
            dense, share)


def test_the_replay_runs_the_steps_collectives_in_order():
    for step, again, dense, share in dlcourse.launch(on_two_ranks, world_size=2):
        assert [op for op, _ in again] == [op for op, _ in step]
        assert all(n_again >= n for (_, n), (_, n_again) in zip(step, again))
        ops = [op for op, _ in step]
        assert ops.count("all_gather") == 2 and ops.count("all_to_all") == 10
        assert ops.count("all_reduce") == dense
        assert share["calls"] == {op: ops.count(op) for op in dict.fromkeys(ops)}
        assert 0 < share["collectives"] and 0 < share["step"]
