"""Optimizer state in CPU memory instead of the GPU: the idea behind ZeRO-Offload (lesson 01).

    optimizer = OffloadAdamW(model.parameters(), lr=1e-3)   # use it like torch.optim.AdamW
    optimizer.host_bytes()            # what lives in host memory: master weights, grads, state
    optimizer.bytes_to_host           # what crossed from the device so far (PCIe on a GPU)

The device keeps only what forward and backward need: the parameters and their gradients.
Every step copies the gradients to the host, runs torch's AdamW there on fp32 master copies of
the weights, and copies the new weights back. Ren et al. 2021 (ZeRO-Offload) move fp16
gradients and parameters, 2Ψ bytes each way per step, and keep 12Ψ + 2Ψ on the CPU.
"""

import torch

from dlcourse.memory.accounting import MemoryParts
from dlcourse.memory.measure import storage_bytes


class OffloadAdamW:
    """AdamW whose state and fp32 master weights live on `host` (default "cpu").
    master_dtype: the master weights' dtype (float64 for an exact proof, as in lesson 05)."""

    def __init__(self, params, host="cpu", master_dtype=torch.float32, **adamw_kwargs):
        self.params = list(params)
        self.master_dtype = master_dtype
        with torch.no_grad():  # fp32 master weights on the host; the device copy may be bf16
            self.master = [p.detach().to(host, master_dtype, copy=True) for p in self.params]
        self.host_optimizer = torch.optim.AdamW(self.master, **adamw_kwargs)
        self.host = torch.device(host)
        self.bytes_to_host = 0  # gradients sent device -> host
        self.bytes_to_device = 0  # updated weights sent host -> device

    @torch.no_grad()
    def step(self):
        for p, master in zip(self.params, self.master):
            if p.grad is None:
                master.grad = None
                continue
            master.grad = p.grad.to(self.host, self.master_dtype, copy=True)  # device -> host
            self.bytes_to_host += p.grad.nbytes
        self.host_optimizer.step()  # Adam's arithmetic runs on the host's cores
        for p, master in zip(self.params, self.master):
            p.copy_(master)  # host -> device, cast to the device copy's dtype
            self.bytes_to_device += p.nbytes

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None if set_to_none else (p.grad.zero_() if p.grad is not None else None)

    def host_bytes(self):
        """Bytes held on the host, as `MemoryParts`: fp32 master weights (params), the
        gradients sent over (grads), and Adam's momentum, variance and step (optimizer)."""
        state = self.host_optimizer.state.values()
        return MemoryParts(params=storage_bytes(self.master),
                           grads=storage_bytes(m.grad for m in self.master if m.grad is not None),
                           optimizer=storage_bytes(t for s in state for t in s.values()
                                                   if torch.is_tensor(t)))


def offload_bytes(n_params, *, mixed_precision=True):
    """ZeRO-Offload's split for Ψ parameters: bytes kept on the device and on the host
    (`MemoryParts`), and bytes sent over the link per step (gradients out, weights back)."""
    w = 2 if mixed_precision else 4  # bytes of one device-side parameter or gradient
    device = MemoryParts(params=w * n_params, grads=w * n_params)
    # The host keeps fp32 master weights (Adam updates them there), the gradients it was sent,
    # and Adam's fp32 momentum and variance.
    host = MemoryParts(params=4 * n_params, grads=w * n_params, optimizer=8 * n_params)
    return {"device": device, "host": host, "per_step": 2 * w * n_params}
