"""`ZeroAdamW`: the optimizer side of every ZeRO stage (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage1(GPT(config), group)      # or ZeroStage2, ZeroStage3
    optimizer = ZeroAdamW(model, lr=1e-3)       # AdamW on this rank's shards only
    optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()

step() is the three moves of a ZeRO step, each a no-op where the stage has done it already:
`model.reduce_gradients()` (stage 1: reduce-scatter now; stages 2, 3: done during backward),
AdamW on the shards, `model.gather_parameters()` (stages 1, 2: all-gather; stage 3: the next
forward gathers). Adam is elementwise, so updating s values per rank is the same arithmetic as
updating all Ψ in one process.
"""

import torch

from dlcourse.memory.measure import storage_bytes
from dlcourse.parallel.zero.offload import ShardOffloadAdamW

LOW_PRECISION = (torch.bfloat16, torch.float16)


class ZeroAdamW:
    """AdamW over `model.shards()`. With 16-bit shards it keeps fp32 master copies (mixed
    precision, K = 12); offload=True keeps them and Adam's state on the CPU (ZeRO-Offload)."""

    def __init__(self, model, lr=1e-3, offload=False, **adamw_kwargs):
        if not hasattr(model, "shards"):
            raise TypeError("ZeroAdamW takes a ZeRO-wrapped model (ZeroStage1/2/3(model, group)), "
                            f"got {type(model).__name__}; wrap the model first")
        self.model = model
        shards = model.shards()
        if offload or shards[0].dtype in LOW_PRECISION:
            host = "cpu" if offload else shards[0].device
            master_dtype = shards[0].dtype if shards[0].dtype not in LOW_PRECISION else torch.float32
            self.inner = ShardOffloadAdamW(shards, host=host, master_dtype=master_dtype, lr=lr,
                                           **adamw_kwargs)
        else:
            self.inner = torch.optim.AdamW(shards, lr=lr, **adamw_kwargs)  # K = 8: m and v

    def step(self):
        self.model.reduce_gradients()
        self.inner.step()
        self.model.gather_parameters()

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none)

    def state_bytes(self):
        """Bytes of optimizer state this rank holds: Adam's m and v (+ fp32 master weights)."""
        if isinstance(self.inner, ShardOffloadAdamW):
            host = self.inner.host_bytes()
            return host.params + host.optimizer
        state = self.inner.state.values()
        return storage_bytes(t for s in state for t in s.values() if torch.is_tensor(t))
