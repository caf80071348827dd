"""The optimizer on the CPU, on top of any stage (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage2(GPT(config).to(torch.bfloat16), group)   # or ZeroStage3
    optimizer = ZeroAdamW(model, lr=1e-3, offload=True)        # the update runs on the host

What this code does: after backward a rank holds its 16-bit gradient shard on the device; the
step sends it to the host (2Ψ/N bytes in bf16), runs AdamW there on the fp32 master shard, and
sends the updated 16-bit shard back (2Ψ/N). Lesson 01's `OffloadAdamW` does exactly that for any
list of tensors; here it is handed the shards. With `host` = the device itself it is simply
mixed-precision AdamW: fp32 master weights beside 16-bit parameters, ZeRO's K = 12.

What the papers call it. ZeRO-Offload (Ren et al. 2021) is built on ZeRO-2: the fp16
parameters stay whole on the GPU (2Ψ), each gradient bucket is reduce-scattered during backward
and the rank's partition copied to the host at once (no gradient shard waits on the device),
and the host keeps the fp16 gradient partition, fp32 master weights, momentum and variance,
(2 + 12)Ψ/N. `ZeroStage2` + offload=True is that layout, except that here the gradient shard
waits on the device until the step (2Ψ/N more device bytes). `ZeroStage3` + offload=True
partitions the 16-bit parameters on the device as well: stage 3 with the optimizer offloaded,
which DeepSpeed ships as "ZeRO-3 Offload", part of ZeRO-Infinity (Rajbhandari et al. 2021), which
can also put the parameters themselves in CPU or NVMe memory. ZeRO-Offload hides the CPU step
behind the next step's forward and backward only with its one-step delayed parameter update
(while the CPU applies one step's gradients, the GPU already runs the next forward and backward
on weights one update old: stale by one step, turned on after some warm-up steps);
this code runs the step in line, not delayed, so it equals one process exactly.
"""

from dlcourse.memory.offload import OffloadAdamW


class ShardOffloadAdamW(OffloadAdamW):
    """`OffloadAdamW` over this rank's shards. The host's fp32 copy of the gradient lives only
    during the step: afterwards the host holds master weights + Adam state, K = 12 bytes each."""

    def step(self):
        super().step()
        for master in self.master:
            master.grad = None


def offload_traffic(n_params, world_size, bytes_per_value=2):
    """Bytes one rank sends over the device-host link per step: its gradient shard out and its
    parameter shard back, Ψ/N values each way (ZeRO-Offload moves 16-bit values: 2 bytes)."""
    per_way = bytes_per_value * n_params / world_size
    return {"to_host": per_way, "to_device": per_way}
