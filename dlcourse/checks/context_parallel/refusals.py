"""What lesson 08's checks refuse while a student's code runs (`answers.py` does the refusing):
- the lesson's own code, every function and class defined in `dlcourse.parallel.context`
  (`merge`, `attention_block`, `Layout`, `ring_attention`, ...), the private ones too: Ulysses'
  `_seq_to_heads` is exercise 4's answer;
- torch's context parallelism (torch 2.13, `torch.distributed.tensor.experimental`:
  `context_parallel`, its ring and its merger `_SDPAMerger`, its K/V rotaters, its load
  balancers, `_HeadTailLoadBalancer` being the zig-zag layout);
- these checks' own code, every function of `dlcourse.checks.context_parallel` (the references
  in `reference.py`, the cases and helpers of each check, private ones too): a check's
  reference is an answer key. (The expected results are computed after the student's function
  returned, or in the checking process while it runs on ranks: no frame holds them.)
"""

import inspect

from dlcourse.checks.answers import library_answers, package_modules, refusing_answers

PACKAGE = "dlcourse.parallel.context"
CHECKS = "dlcourse.checks.context_parallel"
WHY = "it is the lesson's answer to this exercise; write it yourself"
_CP = "torch.distributed.tensor.experimental._context_parallel"
# torch's context parallelism, by the modules that bind it: (module, attribute); those missing
# from an installed torch are left out by `library_answers`.
TORCH_ANSWERS = [("torch.distributed.tensor.experimental", "context_parallel")] + [
    (f"{_CP}._attention", name) for name in (
        "context_parallel", "context_parallel_unshard", "_context_parallel_shard",
        "_templated_ring_attention", "_templated_ring_attention_backward", "_SDPAMerger",
        "_partial_update", "_AllGatherRotater", "_AllToAllRotater", "_ContextParallel")] + [
    (f"{_CP}._load_balancer", name) for name in (
        "_HeadTailLoadBalancer", "_PerDocumentHeadTailLoadBalancer", "_PTRRLoadBalancer")]


def context_answers():
    """[(name, object)]: the lesson's package, torch's context parallelism, these checks."""
    found = {}
    for name, obj in (library_answers(PACKAGE, TORCH_ANSWERS)
                      + _defined_in(PACKAGE, "{name} from {module}")
                      + _defined_in(CHECKS, "the check's {name}")):
        found.setdefault(id(obj), (name, obj))  # each once
    return list(found.values())


def _defined_in(package, label):
    """[(name, object)] of every function and class defined in `package`'s modules, private
    ones included (none while the package is not written)."""
    found = []
    for module in package_modules(package):
        for name, obj in vars(module).items():
            if ((inspect.isfunction(obj) or inspect.isclass(obj))
                    and obj.__module__ == module.__name__):
                found.append((label.format(name=name, module=module.__name__), obj))
    return found


def refusing_context(namespaces=()):
    """While active, every answer raises ForbiddenCall however it is reached; yields the
    `Refused` that finds copies of a refused function."""
    return refusing_answers(context_answers(), WHY, namespaces)


def refuse_context():
    """`run_on_ranks(guard=refuse_context)`: the answers refused in the rank."""
    return refusing_context()


def context_guard_for(fn):
    """`call_in_process(guard=...)`: the answers refused, the student's globals included."""
    return refusing_context([getattr(fn, "__globals__", {})])
