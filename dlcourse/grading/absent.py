"""The answers absent from a graded rank's memory (issue 36).

Refusing the library's answer while a student's code runs (`checks/core/answers.py`) leaves the
answer in the rank: its module in `sys.modules`, its functions' code in `gc.get_objects()`, its
file on disk, for code that gets past the refusal to find. Under `dlcourse grade` the ranks of a
set that declares where its checks' rank-side code lives (`Answers(rank_side=...)`) never import
an answer module at all. Each rank, as its first act, before it unpickles its job:
- puts a finder first on `sys.meta_path` that answers every module of an `Absence`'s `blocked`
  packages with ModuleNotFoundError, save the check package's `rank_side` modules (the
  harnesses, which import no answer), whose package it loads as an empty shell (no `__init__`
  run, so nothing the package's `__init__` imports comes with it);
- adds an audit hook (PEP 578: it cannot be removed) that refuses, for the rank's whole life,
  the `import` statement of a blocked module even once the finder is taken off `sys.meta_path`
  (`importlib.import_module` raises no such event: it then finds no file, or is refused its
  `open`), the `open` of the answers' files (a symlink or `os.link` to one too; a relative path
  by the file's name, since it may be relative to a `dir_fd`), and a function made of, or
  code exec'd that holds, a copy of an answer's code: the checking process sends the rank a
  fingerprint of each answer's code (sha256 of its marshalled code, file names blanked), never
  the code itself;
- checks that no blocked module is loaded yet (a check whose rank-side code imported one would
  put the answer back in memory: it fails loudly instead).
The checks' references run in the checking process; a rank receives inputs and returns data.
Where the rank sandbox can be made (`rank_sandbox.py`) the files are also unreadable there.
"""

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import marshal
import os
import sys
import types


@dataclasses.dataclass(frozen=True)
class Absence:
    """What a graded rank must not have (plain data, built by `Answers.absence`)."""
    blocked: tuple  # module names: each, and every module under it, is absent
    rank_side: tuple  # modules under `blocked` that the rank loads (their packages as shells)
    files: tuple  # the blocked modules' source and compiled files: never opened
    names: tuple  # the answers' qualified names: the fingerprint is taken on a match only
    fingerprints: frozenset  # `fingerprint(code)` of every answer's function and method

    def shells(self):
        """The packages above `rank_side` modules that are blocked: loaded empty."""
        found = set()
        for name in self.rank_side:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts))}
        return {name for name in found if _under(name, self.blocked)}


def _under(name, roots):
    return any(name == root or name.startswith(root + ".") for root in roots)


def fingerprint(code, _marshal=marshal, _sha=hashlib.sha256, _code_type=types.CodeType):
    """sha256 of `code` marshalled with its file name blanked (nested code too) and its first
    line as 1: equal for a copy exec'd from the library file's text under any file name."""
    def blank(c):
        consts = tuple(blank(k) if k.__class__ is _code_type else k for k in c.co_consts)
        return c.replace(co_filename="", co_consts=consts)
    return _sha(_marshal.dumps(blank(code).replace(co_firstlineno=1))).hexdigest()


class _Finder(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path` in a graded rank: blocked modules are not there."""

    def __init__(self, absence):
        self.absence, self.shells = absence, absence.shells()

    def find_spec(self, name, path=None, target=None):
        if name in self.shells:  # the package's folder, its `__init__` never run
            found = importlib.machinery.PathFinder.find_spec(name, path)
            spec = importlib.machinery.ModuleSpec(name, _Shell(), is_package=True)
            spec.submodule_search_locations = list(found.submodule_search_locations)
            return spec
        if _under(name, self.absence.blocked) and name not in self.absence.rank_side:
            raise ModuleNotFoundError(missing(name), name=name)
        return None


class _Shell(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "an empty shell: this package answers the exercise being graded"


def missing(name):
    return (f"No module named {name!r} here: it answers the exercise being graded, and a "
            "graded rank does not have it; write it yourself")


def _hook(event, args, blocked=(), rank_side=(), shells=frozenset(), files=frozenset(),
          names=frozenset(), fingerprints=frozenset(), finder=None, basenames=frozenset(),
          code_type=types.CodeType, basename=os.path.basename,
          function_type=types.FunctionType, under=_under, realpath=os.path.realpath,
          print_fingerprint=fingerprint, denied=PermissionError, not_found=ModuleNotFoundError,
          missing=missing, own=()):
    # Reads no global and no builtin, only its defaults (immutable: tuples and frozensets),
    # which no one may change (the first lines).
    if event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
        if args[0].__class__ is function_type and args[0].__code__ in own:
            raise denied(f"changed {args[1]} of a graded rank's audit hook")
        return
    if event == "import":
        name, meta_path = args[0], args[3]
        loaded_by_finder = (name in shells or name in rank_side) and meta_path \
            and meta_path[0] is finder
        if under(name, blocked) and not loaded_by_finder:
            raise not_found(missing(name), name=name)
    elif event in ("open", "os.link", "os.symlink"):
        for path in (args[0], args[1]) if event != "open" else (args[0],):
            if path.__class__ is bytes:
                path = path.decode(errors="replace")
            # a relative path may be relative to a folder's descriptor (`dir_fd=`), which the
            # event does not carry: refused by the file's name alone
            relative = path.__class__ is str and not path.startswith("/")
            if path.__class__ is str and (realpath(path) in files
                                          or (relative and basename(path) in basenames)):
                raise denied(f"{event} {path!r}: the file of a module that answers the exercise "
                             "being graded; write it yourself")
    elif event in ("exec", "function.__new__"):
        codes = [args[0]]
        while codes:  # the code, and every code nested in it (an exec'd file's functions)
            code = codes.pop()
            if code.__class__ is not code_type:
                continue
            if code.co_qualname in names and print_fingerprint(code) in fingerprints:
                raise denied(f"made {code.co_qualname} from a copy of the library's answer to "
                             "the exercise being graded; write it yourself")
            codes += [c for c in code.co_consts if c.__class__ is code_type]


def is_absent(name):
    """Is module `name` one that this process's `_Finder` keeps out (a graded rank)?"""
    return any(isinstance(finder, _Finder) and _under(name, finder.absence.blocked)
               and name not in finder.absence.rank_side and name not in finder.shells
               for finder in sys.meta_path)


def install(absence):
    """Make `absence` true in this process (a graded rank, before it unpickles its job)."""
    loaded = sorted(name for name in sys.modules if _under(name, absence.blocked)
                    and name not in absence.rank_side and name not in absence.shells())
    if loaded:  # a check's bug, never the student's: the rank's own code brought an answer
        raise RuntimeError(f"a graded rank has {', '.join(loaded)} loaded before its job "
                           "starts: the answers must be absent from it")
    finder = _Finder(absence)
    sys.meta_path.insert(0, finder)
    data = (tuple(absence.blocked), tuple(absence.rank_side), frozenset(absence.shells()),
            frozenset(absence.files), frozenset(absence.names), frozenset(absence.fingerprints),
            finder, frozenset(os.path.basename(f) for f in absence.files))
    hook = types.FunctionType(_hook.__code__, {}, "dlcourse_absent_hook",
                              data + _hook.__defaults__[len(data):-1]
                              + ((_hook.__code__, fingerprint.__code__),))
    sys.addaudithook(hook)
