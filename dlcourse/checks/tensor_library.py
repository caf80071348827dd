"""What lesson 04's checks (`tensor_parallel.py`, `tensor_layers.py`) refuse while a student's
code runs, and the cases they draw.

The answers are the lesson's own tensor-parallel code, every public function and class defined in
a module of `dlcourse.parallel.tensor` (found by walking the package when a check runs, so a
module or a function added later is refused too), and torch's: DTensor's `parallelize_module`,
its parallel styles and `loss_parallel`. An answer is refused three ways at once:
- every name bound to a function in a loaded `dlcourse` or `torch.distributed` module is bound to
  a stand-in that raises ForbiddenCall naming it (`refuse.replaced`); a class keeps its names, so
  that a subclass of it or `Class.method` finds the class, and refuses;
- a function's code is swapped for code that raises, so an alias made before the check, a
  default argument or another module's copy refuses too; so is the code of every method the
  lesson's classes define (`CopyToTensorParallel.backward` called by hand refuses);
- a class's constructor raises, and an autograd Function's `apply` (a subclass's too).
All is put back when the student's code returns.
"""

import contextlib
import importlib
import inspect
import pkgutil
import random
import sys

import torch

from dlcourse.checks.refuse import refusal, replaced

PACKAGE = "dlcourse.parallel.tensor"
WHY = "it is the lesson's answer to this exercise; write it yourself"
# torch's tensor parallelism (DTensor), by the module that binds it: (module, attribute)
TORCH_ANSWERS = [("torch.distributed.tensor.parallel", name) for name in (
    "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "loss_parallel")]


def draw(seed=None):
    """(seed, rng) of this run's cases: `seed` replays a run, else a fresh one is drawn."""
    seed = random.SystemRandom().randrange(10**6) if seed is None else seed
    return seed, random.Random(seed)


def draw_tp_sizes(rng):
    """2, 3 and 4 in a random order: every run holds a tp that is not 4 (nor a power of 2)."""
    sizes = [2, 3, 4]
    rng.shuffle(sizes)
    return sizes


def library_answers():
    """[(name, object)]: the public functions and classes defined in dlcourse.parallel.tensor's
    modules (none while the package does not exist), then torch's DTensor answers."""
    answers = {}
    for module in _package_modules():
        for name, obj in vars(module).items():
            if (not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                    and obj.__module__ == module.__name__):  # defined here, not imported
                answers.setdefault(id(obj), (f"{name} from {module.__name__}", obj))
    for module_name, name in TORCH_ANSWERS:
        obj = getattr(importlib.import_module(module_name), name, None)
        if obj is not None:
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


def _methods(name, cls):
    """[(name, function)] of the functions `cls` defines itself (static and class methods too)."""
    found = []
    for attr_name, attr in vars(cls).items():
        fn = getattr(attr, "__func__", attr)  # staticmethod / classmethod -> the function
        if inspect.isfunction(fn) and fn.__module__ == cls.__module__:
            class_name, _, home = name.partition(" ")  # "Class from module"
            found.append((f"{class_name}.{attr_name} {home}", fn))
    return found


@contextlib.contextmanager
def refusing_tensor(namespaces=()):
    """While active, every library answer raises ForbiddenCall under every name bound to it and
    through the object itself. Yields `refuse.replaced`'s `Refused` (it finds copies)."""
    answers = library_answers()
    library = [(n, o) for n, o in answers if inspect.isclass(o) and not n.startswith("torch")]
    replacements = {}  # id -> (object, stand-in): each swapped once
    # A class keeps its names (a subclass or `Class.method` must find the class, and refuse):
    # its constructor, `apply` and methods refuse instead.
    functions = [(n, o) for n, o in answers if not inspect.isclass(o)]
    for name, obj in functions + [m for n, c in library for m in _methods(n, c)]:
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


def refuse_tensor_library():
    """`run_on_ranks(guard=refuse_tensor_library)`: the answers refused in the rank."""
    return refusing_tensor()


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
