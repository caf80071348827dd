"""A catalogue of real bugs of distributed training, each put into the course's own correct code
for one run (lesson 10, `lessons/10_debugging.ipynb`).

Each `Bug` names a strategy of `subjects.SUBJECTS`, what it breaks, where it was seen in public,
and a `patch()`: a context manager that changes one function of the library while it is open
(unittest.mock), so the library itself stays correct and every bug is off unless asked for:

    find_divergence("TP + SP (lesson 04)", bug="sp_layernorm_grads")

tests/test_debug_catalogue.py checks that the finder names the place each bug's mechanism
predicts. Two hangs are in `HANGS` (run by `data_parallel_steps`); the slow bug (a sync every
micro-batch) is found by its collective count, not by a divergence.
"""

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.debug.subjects import DebugConfig
from dlcourse.models import GPT
from dlcourse.parallel import combine
from dlcourse.parallel.data import overlap, steps
from dlcourse.parallel.context.parallelize import GlobalPositions
from dlcourse.parallel.data.buckets import all_reduce_buckets
from dlcourse.parallel.expert import compare as ep_compare
from dlcourse.parallel.pipeline import executor
from dlcourse.parallel.tensor import compare as tp_compare
from dlcourse.parallel.tensor import dropout as tp_dropout
from dlcourse.parallel.tensor.comm import CopyToTensorParallel, g
from dlcourse.parallel.tensor.layers import RowParallelLinear
from dlcourse.parallel.tensor.parallelize import parallelize
from dlcourse.parallel.zero import clip


@dataclass
class Bug:
    subject: str  # the strategy it breaks (a key of SUBJECTS)
    breaks: str  # what goes wrong, in one line
    source: str  # the public issue or paper where it was seen ("" if none found)
    patches: tuple  # (object, attribute name, replacement) put in place while the run lasts
    config: dict = field(default_factory=dict)  # DebugConfig fields the bug needs to show
    fix: str = ""  # what the correct code does instead, in one line (the lesson prints it)

    @contextmanager
    def patch(self):
        with ExitStack() as stack:
            for obj, attr, value in self.patches:
                stack.enter_context(mock.patch.object(obj, attr, value))
            yield

# --- the broken pieces: each is the correct one with one line changed ------------------------

def _rank_seeded_model(cfg):
    """Each rank draws its own weights: the seed plus the rank (and nothing broadcasts them)."""
    return GPT(cfg.model, seed=cfg.seed + dist.get_rank()).to(cfg.device(), cfg.dtype)


def _finish_bucket_summed(bucket, group, globally_used=None):
    """The all-reduced sum written back without dividing by the world size."""
    bucket.unpack(1, globally_used)


def _world_all_reduce_buckets(buckets, group):
    """The data-parallel gradients averaged over every rank of the job, not the dp axis."""
    all_reduce_buckets(buckets, dist.group.WORLD)


def _local_grad_norm(shards, group):
    """|g| from this rank's shard only: the all-reduce of the squares left out."""
    return torch.sqrt(sum(s.grad.double().square().sum() for s in shards if s.grad is not None))


def _row_forward_bias_per_rank(self, x):
    """RowParallelLinear adding the bias to its partial sum, before g sums over the tp ranks:
    the sum then holds the bias tp times."""
    return g(F.linear(x, self.weight, self.bias), self.group)


@staticmethod
def _f_backward_not_summed(ctx, grad):
    """f's backward passing this rank's partial input gradient on, without the all-reduce."""
    return grad, None


_executor_init = executor.Executor.__init__


def _executor_not_dividing(self, *args, **kwargs):
    """The pipeline's executor with its loss divisor m set to 1: each micro-batch's mean loss is
    backpropagated whole (the executor divides by `self.n_micro`, its only use)."""
    _executor_init(self, *args, **kwargs)
    self.n_micro = 1


def _local_positions(self, local):
    """Context parallelism looking up positions 0..n-1 for a rank's n tokens, wherever they sit."""
    return F.embedding(local, self.weight)


def _experts_all_reduced(model, group):
    """Every gradient all-reduced and averaged, experts too: each rank's experts are different
    ones, so this adds up gradients of different experts."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(dist.get_world_size(group))


def _no_sync_ignored(self):
    """DataParallel.no_sync doing nothing: every micro-batch's backward all-reduces."""
    return nullcontext()


CATALOGUE = {
    "sp_layernorm_grads": Bug(
        "TP + SP (lesson 04)",
        "sequence parallelism leaves the LayerNorm (and position, row-parallel bias) gradients "
        "partial, each rank's tokens only, and nobody all-reduces them",
        "NVIDIA/Megatron-LM#1446 (final_layernorm's main_grad differs between TP ranks with SP, "
        "before the optimizer step); EleutherAI/gpt-neox#1257, the PR adding SP, had the same "
        "gap (#1259 summed the LayerNorm gradients over the tp ranks and made them agree, and "
        "says that did not fix its loss flat-lining)",
        # lesson 07's grids and lesson 04's strategies (`tensor.compare.build`) each call it
        ((combine, "parallelize", partial(parallelize, sum_grads=False)),
         (tp_compare, "parallelize", partial(parallelize, sum_grads=False))),
        fix="all-reduce those partial gradients over the tp group after backward (lesson 04's "
            "all_reduce_sequence_partial_grads; Megatron's finalize_model_grads)"),
    "dp_no_broadcast": Bug(
        "DP overlapped (lesson 03)",
        "replicas start from different weights: each rank seeds by its rank, and DataParallel's "
        "broadcast of rank 0's parameters is left out",
        "torch DDP's constructor: 'Sync params and buffers. Ensures all DDP models start off "
        "at the same value' (_sync_module_states from rank 0, torch/nn/parallel/distributed.py)",
        ((overlap, "broadcast_parameters", lambda module, group: None),
         (DebugConfig, "new_model", _rank_seeded_model)),
        fix="broadcast rank 0's parameters (and buffers) when the model is wrapped"),
    "dp_grads_summed": Bug(
        "DP overlapped (lesson 03)",
        "gradients summed over the ranks where they must be averaged: N times too large "
        "(AdamW hides most of it, SGD does not: lesson 05)",
        "",
        ((overlap, "finish_bucket", _finish_bucket_summed),),
        fix="divide the all-reduced sum by the dp world size"),
    "uneven_batch_unweighted": Bug(
        "DP naive (lesson 03)",
        "an uneven last batch (5 sequences on 2 ranks: 3 and 2) averaged rank by rank, so the "
        "2 sequences of rank 1 weigh as much as rank 0's 3",
        "",
        ((steps, "uneven_loss_scale", lambda local_batch, group: 1.0),),
        dict(global_batch=5),
        fix="scale each rank's mean loss by world_size x local samples / global samples "
            "(uneven_loss_scale), so that every sample weighs the same"),
    "tp_row_bias_per_rank": Bug(
        "TP (lesson 04)",
        "a row-parallel layer adds its bias before the all-reduce: the output holds it tp times",
        "Megatron-LM's RowParallelLinear adds the bias after the all-reduce of the partial "
        "outputs; zero-initialised biases hide this one for a step",
        ((RowParallelLinear, "forward", _row_forward_bias_per_rank),),
        fix="add the bias once, after g has summed the partial outputs"),
    "tp_f_backward_not_summed": Bug(
        "TP (lesson 04)",
        "Megatron's f passes the input gradient of a column-parallel layer on without summing "
        "it over the tp ranks: each rank backpropagates its own partial sum (its heads' or "
        "columns' share) into everything before that layer, so the ranks' copies of it get "
        "different gradients, none of them the whole",
        "Shoeybi et al. 2019, Megatron-LM, sec. 3 (f: identity forward, all-reduce backward)",
        ((CopyToTensorParallel, "backward", _f_backward_not_summed),),
        fix="f's backward all-reduces the input gradient over the tp group"),
    "zero_clip_local_norm": Bug(
        "ZeRO stage 2 (lesson 05)",
        "gradient clipping by the norm of this rank's shard, not the whole gradient's: each "
        "rank scales its shard by a different factor",
        "torch FSDP's FullyShardedDataParallel.clip_grad_norm_: with sharded gradients use it "
        "instead of torch.nn.utils.clip_grad_norm_, as it handles the sharding",
        ((clip, "global_grad_norm", _local_grad_norm),),
        dict(max_grad_norm=1e-3),
        fix="all-reduce the shards' sums of squares over the dp group, then take the root: "
            "one norm, one clip factor on every rank"),
    "pp_loss_not_divided": Bug(
        "PP 1F1B (lesson 06)",
        "the pipeline backpropagates each micro-batch's mean loss undivided by the m "
        "micro-batches: gradients m times too large",
        "pytorch/torchtitan#2972 (PP's schedule backpropagates the token-summed loss and divides "
        "by the global token count only after backward: PP gradients that many times the "
        "non-PP ones); the reverse in pytorch/torchtitan#1733 (with gradient accumulation the "
        "schedule's scale_grads=True divided the whole accumulated gradient by the micro-batches "
        "at every accumulation step, so the earlier steps' share was divided again and again: "
        "too small; fixed in #1732 by scaling the loss instead)",
        ((executor.Executor, "__init__", _executor_not_dividing),),
        fix="divide each micro-batch's loss by m before its backward (the executor's n_micro)"),
    "pp_tied_embeddings_unsynced": Bug(
        "PP 1F1B (lesson 06)",
        "the tied embedding's two copies (first and last stage) do not exchange gradients: "
        "each learns from its own use only, and they drift apart",
        "Megatron-LM's finalize_model_grads: _allreduce_word_embedding_grads all-reduces the "
        "word embedding's gradients over the first and last pipeline stages so that its two "
        "copies stay in sync",
        ((executor, "sync_tied_grads", lambda stages, group=None: None),),
        fix="all-reduce the tied embedding's gradient between the first and last stage before "
            "the step (lesson 06's sync_tied_grads)"),
    "dp_tp_world_group": Bug(
        "DP x TP (lesson 07)",
        "the data-parallel all-reduce on the default (world) group instead of the dp axis: "
        "tp ranks' different shards are averaged together",
        "EleutherAI/gpt-neox#1281 (the same mistake in another collective: sequence "
        "parallelism's reduce-scatter ran without the model-parallel group, which hurt "
        "convergence whenever that group was a subset of the ranks)",
        ((combine, "all_reduce_buckets", _world_all_reduce_buckets),),
        fix="all-reduce over the grid's dp group: each tp rank with the ranks holding its shard"),
    "cp_local_positions": Bug(
        "CP ring (lesson 08)",
        "context parallelism embeds each rank's tokens at positions 0..s/cp-1 instead of the "
        "positions they hold in the sequence",
        "verl-project/verl#6267, a fix (position_ids under context parallelism off by one at "
        "cp = 2, and wrong in the second half of rank 1's tokens)",
        ((GlobalPositions, "forward", _local_positions),),
        fix="embed each token at its position in the whole sequence, as the rank's layout "
            "(contiguous or zig-zag) places it"),
    "ep_experts_all_reduced": Bug(
        "EP + DP (lesson 09, MoE GPT)",
        "the expert gradients all-reduced over the expert-parallel group like the dense ones: "
        "the ranks hold different experts, so their gradients get mixed",
        "",
        ((ep_compare, "average_gradients", _experts_all_reduced),),
        fix="all-reduce the dense gradients only; each rank's experts keep their own gradient "
            "(divided by ep, the batch's share it saw)"),
    "dp_sync_every_micro_batch": Bug(
        "DP bucketed (lesson 03)",
        "gradient accumulation that all-reduces after every micro-batch: right, but m times the "
        "communication (a performance bug: no divergence, the collective count shows it)",
        "torch DDP's no_sync() exists for this (DistributedDataParallel docs)",
        ((overlap.DataParallel, "no_sync", _no_sync_ignored),),
        dict(micro_batches=2),
        fix="run the first m - 1 micro-batches' backward under no_sync(): one all-reduce a step"),
}


# --- dropout under tensor parallelism: a dropout drawing from the wrong random stream ----------
# Each is lesson 04's table `dropout.STREAMS` with the streams changed; "TP + dropout" compares
# with a one process whose masks are, by construction, those of the correct table.

CATALOGUE.update({
    "tp_dropout_heads_shared": Bug(
        "TP + dropout (lesson 04)",
        "the attention-probability dropout drawn from the default stream, seeded alike on every "
        "tp rank: each rank's heads get the same mask, where each rank's must be its own",
        "Megatron-LM's megatron/core/tensor_parallel/random.py: CudaRNGStatesTracker, "
        "get_cuda_rng_tracker().fork() around the attention dropout (DotProductAttention), "
        "model_parallel_cuda_manual_seed: tp state seed + 2718 + tp_rank",
        ((tp_dropout, "STREAMS", {**tp_dropout.STREAMS, "attn.attn_dropout": None}),),
        fix="draw the attention dropout inside the tracker's fork: the per-rank stream"),
    "tp_dropout_resid_per_rank": Bug(
        "TP + dropout (lesson 04)",
        "the residual dropouts (after the row-parallel layers' g) drawn from the per-rank stream: "
        "each tp rank drops other elements of what must be one replicated tensor",
        "Megatron-LM's model_parallel_cuda_manual_seed (tensor_parallel/random.py): the default "
        "stream, the same on the tp ranks, is for dropout in the non-tensor-parallel regions",
        ((tp_dropout, "STREAMS", {**tp_dropout.STREAMS,
                                  "attn.resid_dropout": tp_dropout.TENSOR_PARALLEL,
                                  "mlp.dropout": tp_dropout.TENSOR_PARALLEL}),),
        fix="draw the residual dropouts from the default stream, seeded alike on the tp ranks"),
})


# --- two hangs, for the hang finder (hang.py): a rank-dependent number of steps or sizes ------

HANGS = {
    "uneven_steps": "rank 0's shard holds one batch more: it starts a third step whose "
                    "all-reduce rank 1 never joins (torch.distributed.algorithms.Join exists "
                    "for such uneven inputs)",
    "rank_dependent_size": "each rank builds its model from a config that depends on its rank "
                           "(vocabulary + rank): the gradient all-reduces differ in size",
}


def data_parallel_steps(bug=None, n_steps=2):
    """Lesson 03's naive data parallelism (`average_gradients`, which checks nothing) for a few
    SGD steps on every rank, with one of HANGS switched on; returns the last loss."""
    if bug is not None and bug not in HANGS:
        raise ValueError(f"unknown hang {bug!r}; choose from {list(HANGS)}")
    cfg, rank = DebugConfig(), dist.get_rank()
    if bug == "rank_dependent_size":
        wider = {**vars(cfg.model), "vocab_size": cfg.model.vocab_size + rank}
        cfg.model = type(cfg.model)(**wider)
    model = cfg.new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = steps.shard_batch(cfg.data(), dist.group.WORLD)
    for _ in range(n_steps + (bug == "uneven_steps" and rank == 0)):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        steps.average_gradients(model, dist.group.WORLD)
        optimizer.step()
    return loss.item()
