"""Tensor by tensor: a rank's trace against the reference's (lesson 10,
`lessons/10_debugging.ipynb`).

A rank's activation is its piece of the reference's: the rows of its dp shard of the global
batch (`shard_batch` cuts contiguous rows in rank order; a pipeline's micro-batches come back in
order), and under sequence parallelism its tp piece of the tokens (dim 1). An activation cut
any other way (a column-parallel layer's features, a vocabulary shard of the logits) is not
compared: the next whole activation after it shows any error it carried. Gradients and
parameters are whole on every rank (gathered by the strategy's own helper).

Tolerance: the runs are float64 (`DebugConfig.dtype`); a correct strategy adds the same numbers
in another order. Measured over 2 AdamW steps on every row of `dlcourse tour` at its Subject's
world size (2, 4 or 8 ranks), the largest |Δ| / max(1, |reference|) of any tensor: 2.0e-15 (the
context-parallel rows, DP x CP among them: 1.0e-15 to 2.0e-15; every other row, torch's DTensor
TP, FSDP2 and pipelining included, and lesson 04's TP + dropout: 3.2e-16 to 1.2e-15), each
row's worst a tensor of step 2.
The smallest first gap of a catalogue bug: 1.9e-6 (ZeRO's clip by the local norm). A gap counts
above 1e-9 x max(1, |reference|): six orders of magnitude from each.
"""

TOLERANCE = 1e-9  # relative to max(1, the reference's largest |value|); see above
_PHASES = ("parameters before step 1", "activations", "gradients", "parameters after the step")


def compare_trace(reference, trace, grad_order, subject, cfg):
    """[gap dicts] where this rank's trace (of `subject`) differs from the reference's, each with
    a `position` (step, phase, index in the reference's order) that orders them; and
    {phase: tensors compared in step 1} (activations: in step `subject.activations_from`)."""
    gaps, compared = [], {}
    for (step, phase, ref), (_, _, mine) in zip(reference, trace):
        # the step counted; a stand-in subject (the exercise checks') has no activations_from
        counted = getattr(subject, "activations_from", 1) if phase == _PHASES[1] else 1
        if phase == _PHASES[1] and step < counted:
            continue  # a step whose forward the strategy runs an extra time (Strategy.note)
        names = _order(phase, ref, grad_order)
        for index, name in enumerate(names):
            if name not in mine:
                continue
            got = _view(ref[name], mine[name], subject, cfg) if phase == _PHASES[1] else ref[name]
            if got is None or got.shape != mine[name].shape:
                continue
            compared[phase] = compared.get(phase, 0) + (step <= counted)
            diff = (mine[name].double() - got.double()).abs().max().item()
            scale = got.abs().max().item()
            if diff > TOLERANCE * max(1.0, scale):
                gaps.append(dict(position=(step, _PHASES.index(phase), index), step=step,
                                 phase=phase, name=name, diff=diff, scale=scale))
    return gaps, compared


def aligned(reference, trace, grad_order, subject, cfg):
    """(reference, trace) as `compare_trace` reads them, for a reader of its own (lesson 10's
    exercises): the reference's activations cut to this rank's piece (`_view`), the gradients
    in `grad_order`, and in both traces only the names both hold, in the same order, so position
    i of one is position i of the other; every tensor a copy."""
    refs, mine = [], []
    for (step, phase, ref), (_, _, got) in zip(reference, trace):
        r, m = {}, {}
        for name in _order(phase, ref, grad_order):
            if name not in got:
                continue
            want = _view(ref[name], got[name], subject, cfg) if phase == _PHASES[1] else ref[name]
            if want is not None and want.shape == got[name].shape:
                r[name], m[name] = want.clone(), got[name].clone()
        refs.append((step, phase, r))
        mine.append((step, phase, m))
    return refs, mine


def _order(phase, ref, grad_order):
    if phase != _PHASES[2]:
        return list(ref)  # activations: forward order; parameters: the model's order
    seen = list(dict.fromkeys(grad_order))  # first step's backward order, each name once
    return seen + [n for n in ref if n not in seen]


def _view(ref, mine, subject, cfg):
    """The piece of the reference activation `ref` that this rank's `mine` should equal, or None."""
    if subject.piece is not None:
        return subject.piece(ref)
    if ref.shape == mine.shape:
        return ref
    dp_rank, dp = subject.dp
    if ref.dim() and ref.size(0) == cfg.global_batch:  # batch rows: this rank's dp shard
        ref = ref.tensor_split(dp)[dp_rank] if dp > 1 else ref
    if ref.shape == mine.shape:
        return ref
    tp_rank, tp = subject.tp
    if ref.dim() > 1 and tp > 1 and ref.size(1) == tp * mine.size(1):  # a sequence shard (SP),
        return ref.chunk(tp, dim=1)[tp_rank]  # or (B, a, T, T) attention: this rank's a/t heads
    if ref.size(0) == cfg.model.seq_len and mine.size(0) % ref.size(0) == 0:  # the positions
        # (s, h), no batch dim: a pipeline's first stage computes them once per micro-batch
        return ref.repeat(mine.size(0) // ref.size(0), *[1] * (ref.dim() - 1))
    return None
