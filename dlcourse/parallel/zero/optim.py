"""`ZeroAdamW`: the optimizer side of every ZeRO stage (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage1(GPT(config), group)      # or ZeroStage2, ZeroStage3
    optimizer = ZeroAdamW(model, lr=1e-3)       # AdamW on this rank's shards only
    optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()

step() is the three moves of a ZeRO step, each a no-op where the stage has done it already:
`model.reduce_gradients()` (stage 1: reduce-scatter now; stages 2, 3: done during backward),
AdamW on the shards, `model.gather_parameters()` (stages 1, 2: all-gather; stage 3: the next
forward gathers). Adam is elementwise, so updating s values per rank is the same arithmetic as
updating all Ψ in one process. max_grad_norm clips by the global norm between the first two
(clip.py: one all-reduce of a scalar); optimizer_class=torch.optim.SGD steps the shards with SGD
instead (any elementwise torch optimizer works on shards).
"""

import torch

from dlcourse.memory.measure import storage_bytes
from dlcourse.parallel.zero.clip import clip_grad_norm_
from dlcourse.parallel.zero.offload import ShardOffloadAdamW

LOW_PRECISION = (torch.bfloat16, torch.float16)


class ZeroAdamW:
    """AdamW over `model.shards()`. With 16-bit shards it keeps fp32 master copies (mixed
    precision, K = 12); offload=True keeps them and Adam's state on the CPU (offload.py)."""

    def __init__(self, model, lr=1e-3, offload=False, max_grad_norm=None,
                 optimizer_class=torch.optim.AdamW, **adamw_kwargs):
        if not hasattr(model, "shards"):
            raise TypeError("ZeroAdamW takes a ZeRO-wrapped model (ZeroStage1/2/3(model, group)), "
                            f"got {type(model).__name__}; wrap the model first")
        self.model, self.max_grad_norm, self.grad_norm = model, max_grad_norm, None
        shards = model.shards()
        mixed = offload or shards[0].dtype in LOW_PRECISION
        if mixed and optimizer_class is not torch.optim.AdamW:
            raise ValueError(f"offload and 16-bit shards run AdamW only (OffloadAdamW), got "
                             f"{optimizer_class.__name__}; use fp32 shards for another optimizer")
        if mixed:
            host = "cpu" if offload else shards[0].device
            master_dtype = shards[0].dtype if shards[0].dtype not in LOW_PRECISION else torch.float32
            self.inner = ShardOffloadAdamW(shards, host=host, master_dtype=master_dtype, lr=lr,
                                           **adamw_kwargs)
        else:
            self.inner = optimizer_class(shards, lr=lr, **adamw_kwargs)  # AdamW: K = 8, m and v

    def step(self):
        self.model.reduce_gradients()
        if self.max_grad_norm is not None:  # |g| before clipping, the same on every rank
            self.grad_norm = clip_grad_norm_(self.model.shards(), self.max_grad_norm,
                                             self.model.group)
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
