"""Grader verdicts from a fresh process instead of the submission's kernel (issue 16).

A course grader cell is one call of a check from `dlcourse.checks` on names the notebook
defines, `check_gather_all(gather_all)`; `grader_call` reads that shape. While grading, the kernel
runs `export.cell_source` in its place (the named objects pickled to files), and afterwards
`decide` starts `python -m dlcourse.checks.core.verdict`, where the check runs on those bytes without
unpickling them. A grader cell of another shape (an instructor's own `assert`) keeps the kernel's
verdict, and the gradebook's notes say so.

The protocol: the job goes in on stdin as JSON, with a random key; the verdicts come back as
one stdout line, `DLCOURSE-VERDICTS <json> <hmac-sha256 of json>`. The check's ranks print to
the same stdout, and a line they print cannot carry the key's signature.
"""

import ast
import hashlib
import hmac
import json
import os
import secrets
import sys
from dataclasses import dataclass

from dlcourse.grading import export

VERDICT_TAG = "DLCOURSE-VERDICTS"


@dataclass(frozen=True)
class GraderCall:
    module: str  # "dlcourse.checks.launch"
    function: str  # "check_gather_all"
    args: tuple  # ("name", "gather_all") or ("value", literal), in call order


def grader_call(source):
    """The check call of a grader cell made of imports of `check_y` from a module of the checks
    package and one `check_y(name, ...)` call (positional names or literals); None for any other
    cell."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    if not body or not isinstance(body[-1], ast.Expr) or not isinstance(body[-1].value, ast.Call):
        return None
    imported = {}
    for statement in body[:-1]:
        if not (isinstance(statement, ast.ImportFrom) and statement.level == 0
                and (statement.module or "").startswith("dlcourse.checks.")):
            return None
        imported.update({a.asname or a.name: (statement.module, a.name) for a in statement.names})
    call = body[-1].value
    if not isinstance(call.func, ast.Name) or call.func.id not in imported or call.keywords:
        return None
    args = []
    for arg in call.args:
        if isinstance(arg, ast.Name):
            args.append(("name", arg.id))
        elif isinstance(arg, ast.Constant):
            args.append(("value", arg.value))
        else:
            return None
    module, function = imported[call.func.id]
    return GraderCall(module, function, tuple(args))


def export_source(cell, call):
    """What the kernel runs in place of the grader in code cell `cell`."""
    return export.cell_source(cell, [name for kind, name in call.args if kind == "name"])


def job(calls, folder):
    """(stdin text, key) for the verdict process: `calls` {code cell: GraderCall} whose objects
    were exported under `folder`."""
    key = secrets.token_bytes(32)
    graders = []
    for cell, call in calls.items():
        args, position = [], 0
        for kind, value in call.args:
            if kind == "value":
                args.append({"value": value})
            else:
                args.append({"name": value,
                             "file": os.path.join(folder, export.path(cell, position))})
                position += 1
        graders.append({"cell": cell, "module": call.module, "function": call.function,
                        "args": args})
    return json.dumps({"key": key.hex(), "graders": graders}), key


def command():
    return [sys.executable, "-m", "dlcourse.checks.core.verdict"]


def sign(key, body):
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def read(key, output):
    """{code cell: {} (passed) or {"ename", "evalue"}} from the verdict process's output, or
    None where no line carries the key's signature (the process died, or ran out of time)."""
    for line in reversed(output.splitlines()):
        tag, _, rest = line.partition(" ")
        body, _, mac = rest.rpartition(" ")
        if tag == VERDICT_TAG and hmac.compare_digest(sign(key, body), mac):
            return {int(cell): verdict for cell, verdict in json.loads(body).items()}
    return None
