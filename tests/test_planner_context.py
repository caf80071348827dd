"""The planner's context-parallel axis (lessons 07 and 08): each of cp ranks holds 1/cp of every
sequence, so its activations are those of a sequence cp times shorter; its gradients are reduced,
and ZeRO shards, over dp x cp; K and V are all-gathered over cp (Llama 3's way)."""

from dataclasses import replace

import pytest

from dlcourse.memory import REAL_MODELS
from dlcourse.memory.accounting import model_state_bytes
from dlcourse.planner.catalog import LLAMA3_405B
from dlcourse.planner.estimate import activations_in_flight, estimate, memory_per_gpu, stage_params
from dlcourse.planner.hardware import Cluster, gpu
from dlcourse.planner.layouts import Layout, Workload, layouts, problems
from dlcourse.planner.timing import ring_time

LLAMA7 = REAL_MODELS["Llama-2 7B"]


@pytest.mark.parametrize("cp", [2, 4])
def test_a_cp_rank_holds_the_activations_of_a_cp_times_shorter_sequence(cp):
    long, short = (Workload(LLAMA7, s, 64 * s) for s in (32768, 32768 // cp))
    split = Layout(2, 2, 4, micro_batch=1, micro_batches=32, cp=cp)
    whole = replace(split, cp=1)
    assert activations_in_flight(long, split) == activations_in_flight(short, whole)


def test_zero_shards_over_dp_times_cp():
    work = Workload(LLAMA7, 32768, 64 * 32768)
    L = Layout(4, 2, 1, zero_stage=1, micro_batch=1, micro_batches=16, cp=4)
    n = stage_params(LLAMA7, L)
    state = model_state_bytes(n, dp=16, zero_stage=1).total
    assert memory_per_gpu(work, L) == pytest.approx(state + activations_in_flight(work, L))


def test_the_cp_term_is_two_gathers_and_a_reduce_scatter_of_the_whole_k_and_v():
    work = Workload(LLAMA3_405B, 131072, 128 * 131072)
    cluster = Cluster(gpu("h100"), 16384)
    L = Layout(8, 8, 16, zero_stage=3, micro_batch=1, micro_batches=16, cp=16)
    m = LLAMA3_405B
    kv_bytes = 2 * 131072 * m.kv_heads * (m.hidden // m.n_heads) * 2 / 8  # bf16, split over tp
    alpha, bw = cluster.link(8 * 16)  # cp ranks stand tp apart: 128 GPUs, across nodes
    one = ring_time("all_gather", kv_bytes, 16, alpha, bw)
    per_layer = 2 * one + ring_time("reduce_scatter", kv_bytes, 16, alpha, bw)
    e = estimate(work, L, cluster)
    assert e.cp_time == pytest.approx(16 * m.n_layers / 16 * per_layer)
    assert estimate(work, replace(L, recompute="full"), cluster).cp_time > e.cp_time
    assert estimate(work, replace(L, cp=1, dp=128), cluster).cp_time == 0


def test_cp_is_tried_only_for_long_sequences():
    cluster = Cluster(gpu("h100"), 64)
    short = {L.cp for L in layouts(Workload(LLAMA7, 4096, 256 * 4096), cluster)}
    long = {L.cp for L in layouts(Workload(LLAMA7, 65536, 64 * 65536), cluster,
                                  zero_stages=(1,), recomputes=("none",), interleaves=(1,))}
    assert short == {1}
    assert {2, 4, 8, 16} <= long and 32 not in long  # 65536 / 32 = 2048 tokens: too short


def test_cp_rules_are_named():
    work = Workload(LLAMA7, 12288, 8 * 12288, attention="eager")
    cluster = Cluster(gpu("h100"), 8)
    found = " ".join(problems(Layout(1, 1, 1, micro_batch=1, micro_batches=8, cp=8), work,
                              cluster))
    assert "chunks (cp 8) do not divide" not in found  # 12288 = 16 x 768
    assert "use attention 'fused'" in found
    odd = Workload(LLAMA7, 12040, 8 * 12040)  # 12040 = 16 x 752.5
    found = " ".join(problems(Layout(1, 1, 1, micro_batch=1, micro_batches=8, cp=8), odd,
                              cluster))
    assert "16 chunks (cp 8) do not divide the sequence of 12040 tokens" in found


def test_llama3s_long_context_stage_costs_what_its_8k_stage_costs_per_local_token():
    # CP 16 at 128K leaves each rank 8K tokens, as the 8K stage had: same activations a rank.
    cluster = Cluster(gpu("h100"), 16384)
    long = Layout(8, 8, 16, zero_stage=3, micro_batch=1, micro_batches=16, reshard=False,
                  light_ends=True, cp=16)
    short = replace(long, cp=1, dp=128)
    assert activations_in_flight(Workload(LLAMA3_405B, 131072, 128 * 131072), long) == \
        activations_in_flight(Workload(LLAMA3_405B, 8192, 2048 * 8192), short)
