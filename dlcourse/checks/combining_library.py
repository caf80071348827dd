"""What lesson 07's checks (`combining.py`, `combining_plan.py`) refuse while a student's code runs.

The answers are the lesson's own code: every public function and class of the rank grid
(`dlcourse.parallel.grid`: `RankGrid.coords`, `axis_ranks`, `axis_groups`, ...), of the combined
strategies (`dlcourse.parallel.combine`), of the planner (`dlcourse.planner` and its modules:
`estimate`, `memory_per_gpu`, `plan`, ...) and of lesson 06's schedules and their measures
(`one_f_one_b`, `interleaved_1f1b`, `in_flight_peak`, ...), found by walking the packages when
a check runs so a function added later is refused too; lesson 01's `model_state_bytes`; and torch's
`init_device_mesh` and `DeviceMesh`, which lay ranks out on a grid. An answer is refused however
it is reached (`refuse.replaced`): every name bound to it, the function itself (its code is
swapped, so an alias or a default argument made before the check refuses too), a copy of it
(found in what the student's function refers to), a class's methods and its constructor.
"""

import contextlib
import importlib
import inspect
import pkgutil
import sys

from dlcourse.checks.refuse import refusal, replaced

PACKAGES = ("dlcourse.parallel.grid", "dlcourse.parallel.combine", "dlcourse.planner",
            "dlcourse.parallel.pipeline.measure", "dlcourse.parallel.pipeline.schedules")
# Single answers by the modules that bind them: (module, attribute, how a message names it).
SINGLE = [("dlcourse.memory", "model_state_bytes", "model_state_bytes from dlcourse.memory"),
          ("torch.distributed.device_mesh", "init_device_mesh", "torch's init_device_mesh"),
          ("torch.distributed.device_mesh", "DeviceMesh", "torch's DeviceMesh")]
WHY = "it is the lesson's answer to this exercise; write it yourself"


def library_answers():
    """[(name, object)]: the packages' public functions, classes and the classes' methods, then
    the single answers; each object once."""
    answers = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue  # private, or imported from elsewhere
            if inspect.isfunction(obj) or inspect.isclass(obj):
                answers.setdefault(id(obj), (f"{name} from {module.__name__}", obj))
            if inspect.isclass(obj):
                for method, fn in _methods(obj):
                    answers.setdefault(id(fn), (f"{name}.{method} from {module.__name__}", fn))
    for module_name, attribute, name in SINGLE:
        obj = getattr(importlib.import_module(module_name), attribute)
        answers.setdefault(id(obj), (name, obj))
    return list(answers.values())


def _methods(cls):
    """(name, function) of the methods and property getters `cls` defines itself."""
    for name, value in vars(cls).items():
        fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if inspect.isfunction(fn) and not name.startswith("__"):
            yield name, fn


def _modules():
    modules = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        modules.append(package)
        for info in pkgutil.walk_packages(getattr(package, "__path__", []),
                                          prefix=package_name + "."):
            with contextlib.suppress(Exception):  # a module that fails to import answers nothing
                modules.append(importlib.import_module(info.name))
    return modules


@contextlib.contextmanager
def refusing_combining(namespaces=()):
    """While active, every library answer raises ForbiddenCall under every name bound to it and
    through the object itself; yields `refuse.replaced`'s `Refused` (which finds copies)."""
    answers = library_answers()
    replacements = [(obj, refusal(name, WHY)) for name, obj in answers]
    homes = [vars(m) for n, m in list(sys.modules.items())
             if m is not None and (n.startswith("dlcourse") or n.startswith("torch.distributed"))
             and not n.startswith("dlcourse.checks")]
    with replaced([*homes, *namespaces], replacements) as refused, \
            _disarmed([(name, obj) for name, obj in answers if inspect.isclass(obj)]):
        yield refused


def guard_for(fn):
    """`call_in_process(guard=...)` for the student's function `fn`: its globals included."""
    return refusing_combining([getattr(fn, "__globals__", {})])


@contextlib.contextmanager
def _disarmed(classes):
    """Each class's constructor raises while the block runs (an instance made before the check
    still has its methods refused by `replaced`); then it is put back."""
    undo = []
    try:
        for name, cls in classes:
            had, old = "__init__" in vars(cls), vars(cls).get("__init__")
            setattr(cls, "__init__", refusal(name, WHY, verb="used"))
            undo.append((cls, had, old))
        yield
    finally:
        for cls, had, old in reversed(undo):
            if had:
                setattr(cls, "__init__", old)
            else:
                delattr(cls, "__init__")
