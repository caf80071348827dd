"""What lesson 05's checks (`zero.py`) refuse while a student's code runs.

The answers are the lesson's own ZeRO code, every public function and class defined in a module
of `dlcourse.parallel.zero` (found by walking the package when a check runs, so a module or a
function added later is refused too), and torch's: `ZeroRedundancyOptimizer` (stage 1),
`fully_shard` (FSDP2, stage 3) and `FullyShardedDataParallel`. An answer is refused two ways:
- every name bound to it in a loaded `dlcourse` or torch module, or in the student's globals,
  is bound to a stand-in that raises ForbiddenCall naming it (`refuse.replaced`);
- the object itself refuses, however it was reached (an alias made before the check ran, a
  default argument, another module's copy): `refuse.replaced` swaps a function's code (and the
  code of the function a decorator wraps) for code that raises; here a class's `__init__` (and
  an autograd Function's `apply`) raises. All is put back afterwards.
"""

import contextlib
import importlib
import inspect
import pkgutil
import sys

import torch

from dlcourse.checks.refuse import refusal, replaced

PACKAGE = "dlcourse.parallel.zero"
WHY = "it is the lesson's answer to this exercise; write it yourself"
# torch's ZeRO and FSDP, by the modules that bind them: (module, attribute).
TORCH_ANSWERS = [
    ("torch.distributed.optim", "ZeroRedundancyOptimizer"),
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.fsdp", "FullyShardedDataParallel"),
]


def library_answers():
    """[(name, object)]: the public functions and classes defined in dlcourse.parallel.zero's
    modules (none while the package does not exist), then torch's ZeRO and FSDP."""
    answers = {}
    for module in _package_modules():
        for name, obj in vars(module).items():
            if (not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                    and obj.__module__ == module.__name__):  # defined here, not imported
                answers.setdefault(id(obj), (f"{name} from {module.__name__}", obj))
    for module_name, name in TORCH_ANSWERS:
        obj = getattr(importlib.import_module(module_name), name)
        answers.setdefault(id(obj), (f"torch's {name}", obj))
    return list(answers.values())


def _package_modules():
    try:
        package = importlib.import_module(PACKAGE)
    except ModuleNotFoundError as error:
        if error.name and PACKAGE.startswith(error.name):  # not written yet: nothing to refuse
            return []
        raise
    modules = [package]
    for info in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=PACKAGE + "."):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # a module that does not import cannot hand out an answer either
            continue
    return modules


@contextlib.contextmanager
def refusing_zero(namespaces=(), extra=()):
    """While active, every library answer (and each of `extra`, [(name, object)]) raises
    ForbiddenCall under every name bound to it and through the object itself. Yields
    `refuse.replaced`'s `Refused`, which finds copies of a refused function."""
    answers = library_answers() + list(extra)
    replacements = {}  # id -> (object, stand-in): each swapped once
    for name, obj in answers:
        stand_in = refusal(name, WHY)
        replacements.setdefault(id(obj), (obj, stand_in))
        while inspect.isfunction(obj) and obj.__closure__ and hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__  # a decorator's closure: the function it wraps refuses
            replacements.setdefault(id(obj), (obj, stand_in))
    homes = [vars(m) for n, m in list(sys.modules.items())
             if m is not None and (n.startswith("dlcourse") or n.startswith("torch.distributed"))
             and not n.startswith("dlcourse.checks")]
    with replaced([*homes, *namespaces], list(replacements.values())) as refused, \
            _disarmed([(name, obj) for name, obj in answers if inspect.isclass(obj)]):
        yield refused


def refuse_zero_library():
    """`run_on_ranks(guard=refuse_zero_library)`: the answers refused in the rank."""
    return refusing_zero()


@contextlib.contextmanager
def _disarmed(classes):
    """Make each class's constructor raise (and an autograd Function's `apply`, which makes
    none), so an alias of the class made before the check is refused too; then undo it."""
    undo = []
    try:
        for name, cls in classes:
            methods = ["__init__"] + (["apply"] if issubclass(cls, torch.autograd.Function)
                                      else [])
            undo += [_set_attribute(cls, method, name) for method in methods]
        yield
    finally:
        for restore in reversed(undo):
            restore()


def _set_attribute(cls, method, name):
    had, old = method in vars(cls), vars(cls).get(method)
    stand_in = refusal(name, WHY, verb="used")
    setattr(cls, method, classmethod(stand_in) if method == "apply" else stand_in)

    def restore():
        if had:
            setattr(cls, method, old)
        else:
            delattr(cls, method)

    return restore
