"""Lesson 04's tensor parallelism in the catalogue (`lessons/04_tensor_parallel.ipynb`):
from-scratch TP, TP + sequence parallelism and DTensor TP (`parallel.tensor.compare.build`) on
the tp group, and the TP GPT with dropout whose masks lesson 04's `RNGTracker` draws. Every rank
trains on the whole global batch (tensor parallelism splits the model, not the data)."""

from dataclasses import replace
from functools import partial

import torch

from dlcourse.parallel.tensor import full_parameters, parallelize, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.compare import build as build_variant
from dlcourse.parallel.tensor.compare import step
from dlcourse.parallel.tensor.dropout import one_process_dropout
from dlcourse.parallel.tensor.rng import seed_tensor_parallel
from dlcourse.strategies.trainer import Trainer, count_step, local_state_bytes, rank_of


def build(variant, cfg, groups):
    """The GPT made tensor-parallel as `variant` (one of `compare.VARIANTS`) over the tp group.
    DTensor's column-parallel outputs and vocabulary-sharded logits are pieces the finder does
    not compare (as for the from-scratch TP); the next whole activation carries any error."""
    group = groups.tp
    model, loss_fn, gather = build_variant(variant, cfg.new_model(), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    dtensor = variant.startswith("dtensor")  # DTensor parameters: lesson 01's log cannot key them
    return Trainer([model], optimizer, lambda x, y: step(model, optimizer, loss_fn, x, y).item(),
                   partial(gather, model), lambda: local_state_bytes([model], optimizer),
                   partial(count_step, activations=not dtensor),
                   tp=(0, 1) if dtensor else rank_of(group))


TP_DROPOUT = 0.1  # the dropout of "TP + dropout": GPT-2's, in all three of a block's dropouts


def build_dropout(cfg, groups, p=TP_DROPOUT):
    """Lesson 04's TP GPT with dropout p, its masks from lesson 04's `RNGTracker`
    (`parallelize(..., tracker=)`): the heads' per rank, the residual ones alike on every rank."""
    group = groups.tp
    model = with_dropout(cfg, p).new_model()
    tracker = seed_tensor_parallel(cfg.seed, group)  # after the model: its layers draw at init
    model = parallelize(model, group, tracker=tracker)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss_fn = partial(vocab_parallel_lm_loss, group=group)
    return Trainer([model], optimizer, lambda x, y: step(model, optimizer, loss_fn, x, y).item(),
                   partial(full_parameters, model, group), tp=rank_of(group))


def dropout_reference(cfg, p=TP_DROPOUT, tp=2):
    """Its one process: the GPT whose masks are by construction those tp ranks draw between
    them (`dropout.one_process_dropout`), from seeds of their own, the default stream untouched."""
    return one_process_dropout(with_dropout(cfg, p).new_model(), tp, cfg.seed)


def with_dropout(cfg, p):
    return replace(cfg, model=replace(cfg.model, dropout=p))
