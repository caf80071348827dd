"""Refuse, with the fix, a main program that the ranks could not import.

Every rank process imports the script that started it (multiprocessing does that so a rank can
find the script's functions). Unguarded, that import would call launch again in every rank; a
program read from standard input has no file to import at all.
"""

import ast
import inspect
import os
import sys


def check_main_guard():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path and getattr(main, "__spec__", None) is None and not os.path.isfile(path):
        raise RuntimeError(
            f"dlcourse.launch cannot start ranks from a program without a file (__main__ is "
            f"{path!r}, e.g. `python - <<EOF`): every rank imports the main program. Save it "
            "as a .py file and run that, or run the code in a notebook."
        )
    frame = _script_frame(main, path)
    if frame is None:
        return  # a notebook, `python -c`, or a call made from an imported module
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    line = frame.f_lineno
    if not any(_is_main_guard(node) and node.lineno <= line <= node.end_lineno for node in tree.body):
        raise RuntimeError(
            f"{path}, line {line}: dlcourse.launch is called when the script is imported. Every "
            "rank imports the script, so put the call under a guard:\n\n"
            'if __name__ == "__main__":\n    dlcourse.launch(...)\n'
        )


def _script_frame(main, path):
    """The frame running the top level of the __main__ script, if launch was called from it."""
    if main is None or not path or not str(path).endswith(".py"):
        return None
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


def _is_main_guard(node):
    return isinstance(node, ast.If) and ast.unparse(node.test).replace('"', "'") in (
        "__name__ == '__main__'",
        "'__main__' == __name__",
    )
