"""What lesson 04's checks (`tensor_parallel.py`, `tensor_layers.py`) refuse while a student's
code runs, and the cases they draw.

The answers are the lesson's own tensor-parallel code, every public function and class defined in
a module of `dlcourse.parallel.tensor`, and torch's: DTensor's `parallelize_module`, its
parallel styles and `loss_parallel`; all refused however they are reached, the lesson's
classes through their constructors, `apply` and every method they define (`answers.py`).
"""

import random

from dlcourse.checks import answers

PACKAGE = "dlcourse.parallel.tensor"
WHY = "it is the lesson's answer to this exercise; write it yourself"
# torch's tensor parallelism (DTensor), by the module that binds it: (module, attribute)
TORCH_ANSWERS = [("torch.distributed.tensor.parallel", name) for name in (
    "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "loss_parallel")]


def draw(seed=None):
    """(seed, rng) of this run's cases: `seed` replays a run, else a fresh one is drawn, one of
    2**31: too many to try them all within a check's time limit and find its tensors."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    return seed, random.Random(seed)


def wide_seed(rng):
    """A seed for one tensor (`random_tensor`), one of 2**62: a rank that holds one tensor of a
    case cannot find it, and from it the case's other tensors, by trying seeds."""
    return rng.randrange(2**62)


def draw_tp_sizes(rng):
    """2, 3 and 4 in a random order: every run holds a tp that is not 4 (nor a power of 2)."""
    sizes = [2, 3, 4]
    rng.shuffle(sizes)
    return sizes


def library_answers():
    """[(name, object)]: the public functions and classes defined in dlcourse.parallel.tensor's
    modules (none while the package does not exist), then torch's DTensor answers."""
    return answers.library_answers(PACKAGE, TORCH_ANSWERS)


def refusing_tensor(namespaces=()):
    """While active, every library answer raises ForbiddenCall however it is reached, the
    lesson's classes through their constructors, `apply` and methods (`answers.py`)."""
    return answers.refusing_answers(library_answers(), WHY, namespaces, methods=True)


def refuse_tensor_library():
    """`run_on_ranks(guard=refuse_tensor_library)`: the answers refused in the rank."""
    return refusing_tensor()
