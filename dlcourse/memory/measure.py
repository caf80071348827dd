"""Measure what a training step really holds, from the tensors themselves (lesson 01).

    state = measure_model_state(model, optimizer)      # params + grads + optimizer state, bytes
    step = measure_step(model, x, y, lm_loss, optimizer)
    step.phases["forward"].activations                  # bytes autograd saved for backward

Activations are the tensors autograd saves for backward, seen through
`torch.autograd.graph.saved_tensors_hooks`: every saved tensor passes through our pack hook, and
we count the bytes of each distinct storage once (a view shares its base's buffer; the loss's
log-probabilities, saved by two ops, are one allocation). A saved tensor whose storage is a
parameter is the parameter itself, already counted. On a GPU the CUDA allocator's own figures
come alongside.
"""

import weakref
from dataclasses import dataclass

import torch

from dlcourse.memory.accounting import MemoryParts

def measure_model_state(model, optimizer=None):
    """Bytes of parameters, gradients and optimizer state held now, as `MemoryParts`.

    Each storage is counted once, so a tied weight (the course GPT's embedding and output layer)
    counts once. Buffers (the causal mask) are not model state and are left out.
    """
    params = storage_bytes(model.parameters())
    grads = storage_bytes(p.grad for p in model.parameters() if p.grad is not None)
    state = optimizer.state.values() if optimizer is not None else ()
    opt = storage_bytes(t for s in state for t in s.values() if torch.is_tensor(t))
    return MemoryParts(params=params, grads=grads, optimizer=opt)


def storage_bytes(tensors):
    """Bytes of the distinct storages under `tensors`: views and repeats of one count once."""
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[(t.device, s.data_ptr())] = s.nbytes()
    return sum(storages.values())


@dataclass
class SavedRecord:
    """One tensor autograd saved: where, what, and whether its storage was new."""

    where: str  # the innermost module running when it was saved ("" = outside the model)
    kind: str  # "activations" or "weight_copies"
    shape: tuple
    dtype: torch.dtype
    nbytes: int  # bytes of its whole storage
    new: bool  # False: a storage already counted (a view of it, or saved by a second op)


class SavedTensorLog:
    """Record every tensor autograd saves while the `with` block runs (lesson 01).

        with SavedTensorLog(model) as log:
            loss = loss_fn(model(x), y)
        log.live_bytes()        # {"activations": ..., "weight_copies": ...} still held
        log.records             # one SavedRecord per saved tensor, in order

    Saved parameters are skipped (they are the parameters, wherever their storage is at the
    time), and so are tensors whose storage is one of `ignore` (say, the batch the caller holds
    anyway). A saved tensor that is a low-precision copy of a parameter (autocast's cast
    weights) is counted as "weight_copies".
    A storage counts as held until the last saved tensor on it is released by backward.
    """

    def __init__(self, model=None, ignore=(), on_change=None):
        self.model = model
        self._params = list(model.parameters()) if model is not None else []
        self._skip = {_key(t) for t in [*self._params, *ignore]}
        self._live = {}  # storage key -> [kind, nbytes, saved tensors on it still alive]
        self._where = []  # names of the modules running now, innermost last
        self.records = []
        self.on_change = on_change  # called with an event name whenever the held bytes change

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        self._handles = []
        for name, module in (self.model.named_modules() if self.model is not None else ()):
            self._handles.append(module.register_forward_pre_hook(self._entering(name)))
            self._handles.append(module.register_forward_hook(self._leaving))
        return self

    def _entering(self, name):
        def hook(module, args):
            self._where.append(name)  # returns None: the module's inputs stay as they are
        return hook

    def _leaving(self, module, args, output):
        self._where.pop()  # returns None: the output stays as it is

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()

    def live_bytes(self):
        """Bytes still held by saved tensors, by kind."""
        held = {"activations": 0, "weight_copies": 0}
        for kind, nbytes, alive in self._live.values():
            held[kind] += nbytes if alive else 0
        return held

    def _pack(self, tensor):
        key = _key(tensor)
        if key in self._skip or key in self._param_storages():
            return tensor
        storage = tensor.untyped_storage()
        kind = "weight_copies" if _is_weight_copy(tensor, self._params) else "activations"
        new = key not in self._live or not self._live[key][2]
        if new:
            self._live[key] = [kind, storage.nbytes(), 0]
        # Held while the caller's tensor or autograd's copy lives. Autograd keeps a detached
        # alias (same storage and version counter): a tensor saved by its own grad_fn (softmax's
        # output) would otherwise hold that node and the node the tensor, a cycle that outlives
        # a graph backward never walks (lesson 06's zero-bubble W walks only part of it).
        packed = tensor.detach()
        self._live[key][2] += 2
        weakref.finalize(tensor, self._release, key)  # the caller drops it
        weakref.finalize(packed, self._release, key)  # autograd drops it
        where = self._where[-1] if self._where else ""
        self.records.append(SavedRecord(where, kind, tuple(tensor.shape), tensor.dtype,
                                        storage.nbytes(), new))
        if new and self.on_change:
            self.on_change(f"save {where or 'loss'} {tuple(tensor.shape)}")
        return packed  # the same values: the hook only watches, it changes nothing

    def _param_storages(self):
        """Where the parameters live now: ZeRO-3 (lesson 05) frees a parameter's storage after
        each use and gathers it into new memory, so a key taken at the start goes stale."""
        return {_key(p) for p in self._params if p.untyped_storage().nbytes()}

    def _release(self, key):
        self._live[key][2] -= 1
        if not self._live[key][2] and self.on_change:
            self.on_change("free")


def peak_activations(model, run, ignore=()):
    """Call `run()` with every tensor autograd saves counted (`SavedTensorLog(model, ignore)`);
    return (what it returned, the most activation bytes held at once). A training step's peak
    is where backward starts, every forward's activations still saved; a pipeline's peak is
    wherever its schedule holds the most micro-batches (lesson 06)."""
    peak = 0

    def changed(event):
        nonlocal peak
        peak = max(peak, log.live_bytes()["activations"])

    with SavedTensorLog(model, ignore=ignore, on_change=changed) as log:
        result = run()
    return result, peak


def _unpack(tensor):
    return tensor


def _key(tensor):
    return (tensor.device, tensor.untyped_storage().data_ptr())


def _is_weight_copy(tensor, params, max_steps=4):
    """True if autograd traces `tensor` back to a parameter through a dtype cast and views only,
    for example autocast's bf16 copy of a Linear weight, transposed for the matmul."""
    fn, cast = tensor.grad_fn, False
    for _ in range(max_steps):
        if fn is None:
            return False
        if hasattr(fn, "variable"):  # an AccumulateGrad node: the end of the chain, a leaf
            return cast and any(fn.variable is p for p in params)
        cast = cast or fn.name().startswith("ToCopyBackward")
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


@dataclass
class TimelinePoint:
    event: str  # what just happened: "save ...", "free", "grad ...", or a phase's end
    phase: str  # the phase it happened in: forward, backward or step
    parts: MemoryParts


@dataclass
class StepMemory:
    """What one measured training step held: after each phase, and event by event."""

    phases: dict  # "init", "forward", "backward", "step" -> MemoryParts held at its end
    timeline: list  # TimelinePoint, in order
    saved: list  # SavedRecord, in the order the forward saved them
    loss: float
    cuda: dict | None = None  # phase -> torch.cuda figures (bytes), on a GPU only

    @property
    def peak(self):
        """The timeline point holding the most bytes in all."""
        return max(self.timeline, key=lambda point: point.parts.total)


def measure_step(model, inputs, targets, loss_fn, optimizer, *, autocast_dtype=None):
    """Run one training step of any model and measure the bytes it holds (lesson 01).

    The step: forward and `loss_fn(model(inputs), targets)` (under `torch.autocast` with
    `autocast_dtype`, for example torch.bfloat16, if given), `loss.backward()`,
    `optimizer.step()`. Returns a `StepMemory`: the parts held at the end of each phase, a
    timeline with a point at every saved storage, freed storage and accumulated gradient, and,
    when the model is on a GPU, the CUDA allocator's figures after each phase. The batch
    (`inputs`, `targets`) is the caller's and is not counted as activations.
    """
    recorder = _StepRecorder(model, optimizer, inputs.device)
    log = SavedTensorLog(model, ignore=(inputs, targets), on_change=recorder.point)
    recorder.log = log
    recorder.end("init")
    def on_grad(name):  # a timeline point each time a parameter's .grad is written
        return lambda param: recorder.point(f"grad {name}")

    handles = [p.register_post_accumulate_grad_hook(on_grad(name))
               for name, p in model.named_parameters()]
    try:
        recorder.phase = "forward"
        with log, torch.autocast(inputs.device.type, dtype=autocast_dtype,
                                 enabled=autocast_dtype is not None):
            loss = loss_fn(model(inputs), targets)
        recorder.end("forward")
        recorder.phase = "backward"
        loss.backward()
        recorder.end("backward")
        recorder.phase = "step"
        optimizer.step()
        recorder.end("step")
    finally:
        for handle in handles:
            handle.remove()
    return StepMemory(recorder.phases, recorder.timeline, log.records, loss.item(), recorder.cuda)


class _StepRecorder:
    """Takes the snapshots `measure_step` returns: model state now + saved tensors still held."""

    def __init__(self, model, optimizer, device):
        self.model, self.optimizer, self.log = model, optimizer, None
        self.phase, self.phases, self.timeline = "init", {}, []
        self.cuda = {} if device.type == "cuda" else None
        self.device = device
        if self.cuda is not None:
            torch.cuda.reset_peak_memory_stats(device)

    def snapshot(self):
        parts = measure_model_state(self.model, self.optimizer)
        held = self.log.live_bytes()
        parts.activations, parts.weight_copies = held["activations"], held["weight_copies"]
        return parts

    def point(self, event):
        self.timeline.append(TimelinePoint(event, self.phase, self.snapshot()))

    def end(self, phase):
        self.phases[phase] = self.snapshot()
        self.point(f"end of {phase}")
        if self.cuda is not None:
            self.cuda[phase] = cuda_memory(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)  # the next phase's peak is its own


def cuda_memory(device=None):
    """The CUDA caching allocator's own figures, in bytes: `allocated` (held by tensors now),
    `peak` (most allocated since the last reset) and `reserved` (taken from the GPU, cached)."""
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return {"allocated": torch.cuda.memory_allocated(device),
            "peak": torch.cuda.max_memory_allocated(device),
            "reserved": stats.get("reserved_bytes.all.current", torch.cuda.memory_reserved(device))}
