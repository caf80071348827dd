"""What lesson 08's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`):
- the lesson's own code, every function and class defined in `dlcourse.parallel.context`
  (`merge`, `attention_block`, `Layout`, `ring_attention`, ...), the private ones too: Ulysses'
  `_seq_to_heads` is exercise 4's answer;
- torch's context parallelism (torch 2.13, `torch.distributed.tensor.experimental`:
  `context_parallel`, its ring and its merger `_SDPAMerger`, its K/V rotaters, its load
  balancers, `_HeadTailLoadBalancer` being the zig-zag layout);
- these checks' own code, every function of `dlcourse.checks.context` (the references
  in `reference.py`, the cases and helpers of each check, private ones too): a check's
  reference is an answer key. (The expected results are computed after the student's function
  returned, or in the checking process while it runs on ranks: no frame holds them.)
Under `dlcourse grade` a rank has none of these modules at all: it loads `in_rank.py` only
(`rank_side`), and the in-process refusal is left for torch's answers.
"""

from dlcourse.checks.core.answers import Answers

_CP = "torch.distributed.tensor.experimental._context_parallel"
# torch's context parallelism, by the modules that bind it: (module, attribute); those missing
# from an installed torch are left out.
TORCH_ANSWERS = (("torch.distributed.tensor.experimental", "context_parallel"),) + tuple(
    (f"{_CP}._attention", name) for name in (
        "context_parallel", "context_parallel_unshard", "_context_parallel_shard",
        "_templated_ring_attention", "_templated_ring_attention_backward", "_SDPAMerger",
        "_partial_update", "_AllGatherRotater", "_AllToAllRotater", "_ContextParallel")) + tuple(
    (f"{_CP}._load_balancer", name) for name in (
        "_HeadTailLoadBalancer", "_PerDocumentHeadTailLoadBalancer", "_PTRRLoadBalancer"))

ANSWERS = Answers(packages=("dlcourse.parallel.context",), torch=TORCH_ANSWERS,
                  checks=("dlcourse.checks.context",), private=True,
                  rank_side=("dlcourse.checks.context.in_rank",))
