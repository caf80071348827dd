"""ZeRO-Offload on top of the stages: fp32 master weights, Adam state and the update on the CPU
(lesson 05: `lessons/05_zero.ipynb`; Ren et al. 2021).

    model = ZeroStage3(GPT(config).to(torch.bfloat16), group)
    optimizer = ZeroAdamW(model, lr=1e-3, offload=True)   # the update runs on the host

The device keeps the 16-bit parameter and gradient shards; each step sends this rank's gradient
shard to the host (2Ψ/N bytes in bf16), runs AdamW there on the fp32 master shard, and sends the
updated shard back (2Ψ/N). Lesson 01's `OffloadAdamW` does exactly that for any list of tensors;
here it is handed the shards. With `host` = the device itself it is simply mixed-precision AdamW:
fp32 master weights beside 16-bit parameters, ZeRO's K = 12.
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
