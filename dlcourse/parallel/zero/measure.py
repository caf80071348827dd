"""What a ZeRO rank holds and sends, measured, beside the paper's formulas (lesson 05).

    held = held_bytes(model, optimizer)          # MemoryParts read from the storages held now
    model_state_bytes(Ψ, dp=N, zero_stage=2)     # ZeRO's formula (dlcourse.memory, lesson 01)
    comm = count_step(model, optimizer, x, y)    # lesson 02's CommCounter over one whole step
    comm_formula(stage, Ψ, N)                    # 2Ψ or 3Ψ, times (N-1)/N, in bytes

Every figure is read from tensors actually alive, each storage once: a freed stage-3 unit has a
storage of 0 bytes, and a shard that is a view of a flat buffer counts with that buffer. Each
flat buffer is padded to a multiple of N, so a rank holds ceil(Ψ_unit/N) values per unit: at
most N - 1 values per unit more than Ψ/N.
"""

from torch.profiler import ProfilerActivity, profile, record_function

from dlcourse.collectives import CommCounter
from dlcourse.memory import MemoryParts, OffloadAdamW, measure_model_state
from dlcourse.memory.measure import storage_bytes
from dlcourse.memory.peak import (  # lesson 01's allocation walk
    quiet_stderr,
    running_sum,
)
from dlcourse.models import lm_loss


def held_bytes(model, optimizer):
    """Model-state bytes this rank holds now, as `MemoryParts` (params, grads, optimizer).

    model: a ZeroStage1/2/3, lesson 03's DataParallel, torch's DDP or a plain module.
    optimizer: ZeroAdamW, torch's AdamW, or lesson 01's OffloadAdamW (fp32 master weights are
    optimizer state, as ZeRO's K = 12 counts them)."""
    module = getattr(model, "module", model)
    if hasattr(model, "shards"):  # ZeRO: the shards are held besides the (maybe freed) params
        shards = model.shards()
        params = storage_bytes([*module.parameters(), *shards])
        grads = storage_bytes([*(p.grad for p in module.parameters() if p.grad is not None),
                               *(s.grad for s in shards if s.grad is not None)])
        return MemoryParts(params=params, grads=grads, optimizer=optimizer.state_bytes())
    if isinstance(optimizer, OffloadAdamW):
        parts = measure_model_state(module)
        host = optimizer.host_bytes()
        parts.optimizer = host.params + host.optimizer
        return parts
    return measure_model_state(module, optimizer)


def comm_formula(stage, n_params, world_size, bytes_per_value=4):
    """Bytes one rank sends per step by ZeRO's count (Section 7): data parallel (stage 0) and
    stages 1, 2 move 2Ψ (all-reduce = reduce-scatter + all-gather); stage 3 moves 3Ψ (the
    parameters all-gathered twice, the gradients reduce-scattered once). Each of these ring
    collectives sends (N-1)/N of its payload from every rank."""
    passes = 3 if stage == 3 else 2
    return passes * n_params * bytes_per_value * (world_size - 1) / world_size


def train_steps(model, optimizer, x, y, steps):
    """`steps` AdamW steps on (x, y): lesson 03's loop body. Returns the last loss."""
    for _ in range(steps):
        optimizer.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()


def count_step(model, optimizer, x, y):
    """The collectives of one whole step (forward, backward, optimizer step) on this rank,
    recorded by lesson 02's `CommCounter`: `.bus_bytes()`, `.by_op()`."""
    optimizer.zero_grad()
    with CommCounter() as comm:
        lm_loss(model(x), y).backward()
        optimizer.step()
    return comm


def padding_bytes(model, bytes_per_value):
    """Bytes of padding in one rank's shards: sum over units of s - Ψ_unit/N values."""
    return sum(u.shard_numel - u.numel / u.world_size for u in model.units) * bytes_per_value


def step_peak(model, optimizer, x, y, held=held_bytes):
    """The most bytes live at once during one whole step (forward, backward, optimizer step),
    every CPU allocation counted by torch's profiler (lesson 01's `measure_peak`), starting from
    the model state (`held(model, optimizer)`: MemoryParts) and the batch held before it.
    Returns (peak, held before)."""
    optimizer.zero_grad()
    before = held(model, optimizer).model_state + storage_bytes([x, y])
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            loss = lm_loss(model(x), y)
        loss.backward()
        optimizer.step()
    del loss
    events = list(prof.profiler.kineto_results.events())
    forward = next(e for e in events if e.name() == "forward")
    return running_sum(events, forward.start_ns() + forward.duration_ns(), before).bytes, before


def peak_formula(stage, held_before, working_bytes, gathered_bytes=0):
    """Predicted peak of one step on a rank: the model state it holds before the step, plus
    the working memory of the step (activations, gradients as backward makes them, Adam's
    temporaries: `step_peak` of one process, minus what that process held before), plus, in
    stage 3 only, the units gathered at once (`gathered_bytes`)."""
    return held_before + working_bytes + (gathered_bytes if stage == 3 else 0)


def gathered_bytes(model):
    """Stage 3's full parameters alive at the step's peak: the root unit (kept all step) and one
    block. The peak is where backward starts, every activation still held, with the last block
    gathered alone (`ZeroStage3` does not prefetch from it); two blocks are gathered at once only
    later, when a block's activations are already freed."""
    sizes = [u.padded * u.params[0].element_size() for u in model.units]
    root = sizes.pop(model.root)
    return root + max(sizes)
