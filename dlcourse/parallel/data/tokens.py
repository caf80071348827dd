"""Loss normalisation by tokens for variable-length sequences under gradient accumulation
(lesson 03).

    n = global_token_count([y for _, y in micro_batches], group)  # real tokens, all ranks, one step
    loss = token_loss_sum(model(x), y) * world_size / n             # each micro-batch's part

Padded positions carry the target IGNORE and count for nothing. One process on the whole batch
averages the loss over all its real tokens. Averaging per micro-batch instead (each micro-batch's
own mean, then the mean over micro-batches and ranks) weighs a token of a short micro-batch more
than a token of a long one: another gradient. (The Hugging Face Trainer computed the loss that
way under gradient accumulation until late 2024.) Summing the token losses and dividing by the
step's token count over every rank gives the one-process gradient; the factor world_size undoes
the division by the number of ranks that the gradient all-reduce (DDP, `DataParallel`) applies.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE = -100  # the target of a padded position: torch's cross_entropy ignore_index default


def token_loss_sum(logits, targets):
    """Sum of the cross-entropy over the real (not IGNORE) tokens: (B, T, V), (B, T) -> ()."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                           reduction="sum")


def count_tokens(targets):
    """Real tokens in a (B, T) tensor of targets."""
    return int((targets != IGNORE).sum())


def global_token_count(targets_list, group):
    """Real tokens of one optimizer step: this rank's micro-batches, summed over the group."""
    count = torch.tensor(sum(count_tokens(y) for y in targets_list), dtype=torch.int64)
    dist.all_reduce(count, group=group)
    return int(count)


def pad_after(targets, lengths):
    """A copy of (B, T) `targets` with position t of sequence i set to IGNORE where
    t >= lengths[i]: sequences of different lengths padded to one T."""
    lengths = torch.as_tensor(lengths)
    too_short, too_long = (lengths < 1).any(), (lengths > targets.size(1)).any()
    if lengths.shape != targets.shape[:1] or too_short or too_long:
        raise ValueError(f"pad_after needs one length per sequence, each in 1..{targets.size(1)}; "
                         f"got {lengths.tolist()} for {targets.size(0)} sequences")
    padded = targets.clone()
    padded[torch.arange(targets.size(1)) >= lengths[:, None]] = IGNORE
    return padded
