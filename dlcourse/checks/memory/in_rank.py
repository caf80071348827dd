"""The rank side of lesson 01's checks: the refusal of building a module, entered in the rank
where a student's formula runs (`calls.answer`). It holds none of the checks' references and
imports none of the lesson's code: under `dlcourse grade` it is the one module of the set a rank
loads (`answers.ANSWERS.rank_side`, `grading/absent.py`), and `dlcourse.memory`, whose
functions are the formulas' answers, is absent there.
"""

import contextlib

import torch

from dlcourse.checks.core import refusal


@contextlib.contextmanager
def no_modules(why):
    """A class's __init__ reaches Module.__init__ through super(), so every model, Linear or
    LayerNorm built while this is active is refused, however it was imported."""
    module_init = torch.nn.Module.__init__
    torch.nn.Module.__init__ = refusal("a torch module (GPT, MLPBlock, nn.Linear, ...)",
                                       why, verb="built")
    try:
        yield
    finally:
        torch.nn.Module.__init__ = module_init
