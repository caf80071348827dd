"""A lesson's whole package of answers refused while a student's code runs (lessons 04-07).

A lesson's answers are every public function and class defined in a module of its package (found
by walking the package when a check runs, so a module or a function added later is refused too),
and torch's functions that do the same job. `refusing_answers` refuses them all at once:
- every name bound to one in a loaded `dlcourse` or `torch.distributed` module, or in the
  student's globals, is bound to a stand-in that raises ForbiddenCall naming it
  (`refuse.replaced`); with `methods=True` a class keeps its names instead, so that a subclass or
  `Class.method` finds the class and refuses through its methods;
- a function's code is swapped for code that raises (and so is the code of the function a
  decorator wraps, and with `methods=True` every method the package's classes define), so an
  alias made before the check, a default argument or another module's copy refuses too;
- a class's constructor raises, and an autograd Function's `apply`.
All is put back when the block ends.
"""

import contextlib
import importlib
import inspect
import pkgutil
import sys

import torch

from dlcourse.checks.refuse import refusal, replaced


def library_answers(package, torch_answers=()):
    """[(name, object)]: the public functions and classes defined in `package`'s modules (none
    while it does not exist), then each (module, attribute) of `torch_answers` that exists."""
    answers = {}
    for module in package_modules(package):
        for name, obj in vars(module).items():
            if (not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                    and obj.__module__ == module.__name__):  # defined here, not imported
                answers.setdefault(id(obj), (f"{name} from {module.__name__}", obj))
    for module_name, name in torch_answers:
        obj = getattr(importlib.import_module(module_name), name, None)
        if obj is not None:
            answers.setdefault(id(obj), (f"torch's {name}", obj))
    return list(answers.values())


def package_modules(package):
    """The package and every module in it that imports; [] if the package is not written yet."""
    try:
        root = importlib.import_module(package)
    except ModuleNotFoundError as error:
        if error.name and package.startswith(error.name):  # not written yet: nothing to refuse
            return []
        raise
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=package + "."):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # a module that does not import cannot hand out an answer either
            continue
    return modules


@contextlib.contextmanager
def refusing_answers(answers, why, namespaces=(), methods=False):
    """While active, each of `answers` ([(name, object)]) raises ForbiddenCall, however it is
    reached (see the module's docstring). Yields `refuse.replaced`'s `Refused`."""
    kept = [(n, o) for n, o in answers if inspect.isclass(o)] if methods else []
    targets = [(n, o) for n, o in answers if not (methods and inspect.isclass(o))]
    targets += [m for n, c in kept if not n.startswith("torch") for m in class_methods(n, c)]
    replacements = {}  # id -> (object, stand-in): each swapped once
    for name, obj in targets:
        stand_in = refusal(name, why)
        replacements.setdefault(id(obj), (obj, stand_in))
        while inspect.isfunction(obj) and obj.__closure__ and hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__  # a decorator's closure: the function it wraps refuses
            replacements.setdefault(id(obj), (obj, stand_in))
    homes = [vars(m) for n, m in list(sys.modules.items())
             if m is not None and (n.startswith("dlcourse") or n.startswith("torch.distributed"))
             and not n.startswith("dlcourse.checks")]
    with replaced([*homes, *namespaces], list(replacements.values())) as refused, \
            _disarmed([(n, o) for n, o in answers if inspect.isclass(o)], why):
        yield refused


def class_methods(name, cls):
    """[(name, function)] of the functions `cls` defines itself (static and class methods too)."""
    found = []
    for attr_name, attr in vars(cls).items():
        fn = getattr(attr, "__func__", attr)  # staticmethod / classmethod -> the function
        if inspect.isfunction(fn) and fn.__module__ == cls.__module__:
            class_name, _, home = name.partition(" ")  # "Class from module"
            found.append((f"{class_name}.{attr_name} {home}", fn))
    return found


@contextlib.contextmanager
def _disarmed(classes, why):
    """Make each class's constructor raise (and an autograd Function's `apply`, which makes
    none), so an alias of the class made before the check is refused too; then undo it."""
    undo = []
    try:
        for name, cls in classes:
            names = ["__init__"] + (["apply"] if issubclass(cls, torch.autograd.Function) else [])
            undo += [_set_attribute(cls, method, name, why) for method in names]
        yield
    finally:
        for restore in reversed(undo):
            restore()


def _set_attribute(cls, method, name, why):
    had, old = method in vars(cls), vars(cls).get(method)
    stand_in = refusal(name, why, verb="used")
    setattr(cls, method, classmethod(stand_in) if method == "apply" else stand_in)

    def restore():
        if had:
            setattr(cls, method, old)
        else:
            delattr(cls, method)

    return restore
