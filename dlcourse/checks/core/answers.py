"""The one engine that refuses an exercise set's answers while a student's code runs (lessons
01-07, and every set after them).

An exercise set declares its answers once, as an `Answers`:
- `packages`: the lesson's own code: every public function and class defined in a module of each
  package (walked when a check runs, so a module or a function added later is refused too), the
  private ones too with `private=True` (where a private helper is an exercise's answer);
- `torch`: torch's version of it: (module, attribute) pairs, or a module's name for everything
  the module defines (private names too);
- `single`: one function or class more each, (module, attribute), e.g. an earlier lesson's formula;
- `checks`: the set's own check package: every function its modules define (references,
  simulators, helpers) is an answer key a student could import, so it refuses too; `allow` names
  the ones the student legitimately calls back; the modules' names are put back when the block
  ends, so a student who rebinds a check's helper changes nothing the check calls afterwards;
- `also`: guards of another kind, context-manager factories entered with the refusals (a torch
  module's constructor, a table of the lesson's).
`answers.refusing(namespaces)` refuses them all, however reached (`refuse.replaced`):
- every name bound to one in a loaded `dlcourse` or `torch.distributed` module, or in
  `namespaces` (the student's globals), is bound to a stand-in that raises ForbiddenCall naming it;
  with `keep_classes=True` a class keeps its names, so a subclass or `Class.method` finds the
  class and refuses through its methods;
- a function's code is swapped for code that raises (the function a decorator wraps too, and
  every method the classes define), so an alias made before the check, a default argument or
  another module's copy refuses too; `copies_in` finds a copy rebuilt from the code;
- a class's constructor raises, and an autograd Function's `apply`.
All is put back when the block ends. `run_on_ranks(guard=answers.in_rank)` and
`call_in_process(guard=answers.in_process)` are the two ways a check asks for it.
"""

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys

import torch

from dlcourse.checks.core.refuse import refusal, replaced

WHY = "it is the lesson's answer to this exercise; write it yourself"
WHY_KEY = "it is the check's own answer key; write it yourself"


@dataclasses.dataclass
class Answers:
    """What an exercise set refuses while the student's code runs (see the module's docstring)."""
    packages: tuple = ()  # the lesson's packages, walked: public functions and classes
    torch: tuple = ()  # (module, attribute), or a module's name: all it defines
    single: tuple = ()  # (module, attribute): one answer more each
    checks: tuple = ()  # the set's check modules: all their functions
    allow: tuple = ()  # names of check functions the student's code may call back
    also: tuple = ()  # context-manager factories entered with the refusals
    why: str = WHY
    keep_classes: bool = False  # a class keeps its names, refused through its methods
    private: bool = False  # the packages' private functions and classes are answers too
    # the modules of `checks` that run in a graded rank (harnesses, importing no answer): a
    # graded rank has none of the answer modules but these (`absence`); () for none
    rank_side: tuple = ()

    def objects(self):
        """[(name, object)]: the library's and torch's answers, each once."""
        found = dict((id(o), (n, o)) for n, o in library_answers(self.packages, self.torch,
                                                                  self.private))
        for module_name, attribute in self.single:
            try:
                obj = getattr(importlib.import_module(module_name), attribute)
            except ModuleNotFoundError as error:  # absent from a graded rank: nothing to refuse
                if error.name != module_name and not _absent_here(error.name):
                    raise
                continue
            found.setdefault(id(obj), (f"{attribute} from {module_name}", obj))
        return list(found.values())

    def keys(self):
        """[(name, function)]: the functions the set's check modules (a package: every module
        in it) define, less `allow`."""
        found = []
        for module in (m for name in self.checks for m in package_modules(name)):
            found += [(f"{name} from {module.__name__}", obj) for name, obj in vars(module).items()
                      if inspect.isfunction(obj) and obj.__module__ == module.__name__
                      and name not in self.allow]
        return found

    def refusing(self, namespaces=()):
        """While active, every answer and answer key raises ForbiddenCall however it is
        reached. Yields `refuse.replaced`'s `Refused` (which finds copies). The context
        manager's `answers` is this declaration (its `absence`, for the ranks of a graded
        job: `ranks.graded_launch`)."""
        manager = self._refusing(namespaces)
        manager.answers = self
        return manager

    def absence(self):
        """The `grading.absent.Absence` of a graded rank of this set: the answer modules (the
        packages, `single`'s modules and the check packages, less `rank_side`), their files,
        and the fingerprints of their functions' code (computed here, where they are loaded)."""
        from dlcourse.grading.absent import Absence
        files = self._files()
        rank_side = tuple(self.rank_side)
        blocked = tuple(dict.fromkeys([*self.packages, *self.checks,
                                       *(m for m, _ in self.single)]))
        kept = [f for name in rank_side for f in _files(importlib.import_module(name))]
        return Absence(blocked=blocked, rank_side=rank_side,
                       files=tuple(os.path.realpath(f) for f in files if f not in kept),
                       **_fingerprinted(self.objects() + self.keys(), rank_side))

    def _files(self):
        """The source and compiled files of the course's modules that answer this set (its
        packages, `single`'s modules, its check modules)."""
        names = [module_name for module_name, _ in self.single]
        names += [m.__name__ for package in (*self.packages, *self.checks)
                  for m in package_modules(package)]
        return [f for name in dict.fromkeys(names) for f in _files(importlib.import_module(name))]

    @contextlib.contextmanager
    def _refusing(self, namespaces=()):
        with contextlib.ExitStack() as stack:
            for module in (m for name in self.checks for m in package_modules(name)):
                stack.callback(_restore, vars(module), dict(vars(module)))
            for guard in self.also:
                stack.enter_context(guard())
            yield stack.enter_context(refusing_answers(
                self.objects(), self.why, namespaces, methods=self.keep_classes,
                keys=self.keys()))

    def in_rank(self):
        """`run_on_ranks(guard=answers.in_rank)`: the answers refused in the rank."""
        return self.refusing()

    def in_process(self, fn):
        """`call_in_process(guard=answers.in_process)`: the student's globals included."""
        return self.refusing([getattr(fn, "__globals__", {})])

    def but(self, **changes):
        """This declaration with some fields changed: one exercise's own refusals."""
        return dataclasses.replace(self, **changes)


def _files(module):
    """A course module's source and compiled files; none for another's."""
    source = getattr(module, "__file__", None)
    if not source or not module.__name__.startswith("dlcourse"):
        return []
    return [source, importlib.util.cache_from_source(source)]


def _fingerprinted(answers, rank_side):
    """{"names", "fingerprints"} of the code of `answers` ([(name, object)]: functions, and
    classes' methods) that the course defines, less what `rank_side` modules define."""
    from dlcourse.grading.absent import fingerprint
    functions = []
    for name, obj in answers:
        module = getattr(obj, "__module__", None) or ""
        if module in rank_side or not module.startswith("dlcourse"):  # torch is not absent
            continue
        if inspect.isclass(obj):
            functions += [fn for _, fn in class_methods(name, obj)]
        elif inspect.isfunction(obj):
            functions.append(inspect.unwrap(obj))
    codes = [fn.__code__ for fn in functions]
    return {"names": tuple(sorted({c.co_qualname for c in codes})),
            "fingerprints": frozenset(fingerprint(c) for c in codes)}


def _restore(namespace, saved):
    """Put a check module's names back as they were: a student's code may rebind a check's
    helper (`layers._heads = ...`) for the check to call after it returned."""
    for name in set(namespace) - set(saved):
        del namespace[name]
    for name, value in saved.items():
        if namespace.get(name) is not value:
            namespace[name] = value


def library_answers(packages, torch_answers=(), private=False):
    """[(name, object)]: the public functions and classes defined in the modules of `packages`
    (a name or several; none while one does not exist; the private ones too with `private`),
    then torch's: each (module, attribute) of `torch_answers` that exists, or everything a
    module named alone defines."""
    answers = {}
    for package in [packages] if isinstance(packages, str) else packages:
        for module in package_modules(package):
            for name, obj in _defined_in(module, private=private):
                answers.setdefault(id(obj), (f"{name} from {module.__name__}", obj))
    for entry in torch_answers:
        if isinstance(entry, str):  # a whole module of torch's
            for name, obj in _defined_in(importlib.import_module(entry), private=True):
                answers.setdefault(id(obj), (f"{name} from {entry}", obj))
            continue
        obj = getattr(importlib.import_module(entry[0]), entry[1], None)
        if obj is not None:
            answers.setdefault(id(obj), (f"torch's {entry[1]}", obj))
    return list(answers.values())


def _absent_here(name):
    """Is module `name` absent from this process, a graded rank (`grading/absent.py`)?"""
    absent = sys.modules.get("dlcourse.grading.absent")
    return absent is not None and absent.is_absent(name)


def _defined_in(module, private):
    return [(name, obj) for name, obj in vars(module).items()
            if (private or not name.startswith("_"))
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == module.__name__]  # defined here, not imported


def package_modules(package):
    """The package and every module in it that imports; [] if the package is not written yet."""
    try:
        root = importlib.import_module(package)
    except ModuleNotFoundError as error:
        # not written yet, or absent from a graded rank (it imports another answer module, e.g.
        # lesson 06's measures import its schedules): nothing to refuse
        if error.name and (package.startswith(error.name) or _absent_here(error.name)):
            return []
        raise
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=package + ".",
                                      onerror=lambda name: None):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # a module that does not import cannot hand out an answer either
            continue
    return modules


@contextlib.contextmanager
def refusing_answers(answers, why, namespaces=(), methods=False, keys=()):
    """While active, each of `answers` ([(name, object)]) raises ForbiddenCall, however it is
    reached (see the module's docstring), and so does each function of `keys` (a check's own,
    refused by its code only: the check's modules keep their names). Yields `Refused`."""
    classes = [(n, o) for n, o in answers if inspect.isclass(o)]
    named = [(n, o) for n, o in answers if not (methods and inspect.isclass(o))]
    swapped = [m for n, c in classes for m in class_methods(n, c)] + list(keys)
    key_ids = {id(fn) for _, fn in keys}
    replacements = {}  # id -> (object, stand-in): each once
    for name, obj in named + swapped:
        stand_in = refusal(name, WHY_KEY if id(obj) in key_ids else why)
        replacements.setdefault(id(obj), (obj, stand_in))
        while inspect.isfunction(obj) and obj.__closure__ and hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__  # a decorator's closure: the function it wraps refuses
            replacements.setdefault(id(obj), (obj, stand_in))
    homes = [vars(m) for n, m in list(sys.modules.items())
             if m is not None and (n.startswith("dlcourse") or n.startswith("torch.distributed"))
             and not n.startswith("dlcourse.checks")]
    with replaced([*homes, *namespaces], list(replacements.values())) as refused, \
            _disarmed(classes, why):
        yield refused


def class_methods(name, cls):
    """[(name, function)] of the functions `cls` defines itself (static and class methods and
    property getters too; not the dunders but `__call__`: a constructor is `_disarmed`)."""
    found = []
    for attr_name, attr in vars(cls).items():
        fn = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
        if (inspect.isfunction(fn) and fn.__module__ == cls.__module__
                and (not attr_name.startswith("__") or attr_name == "__call__")):
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
