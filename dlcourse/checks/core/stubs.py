"""The stub `dlcourse exercises build` writes for an exercise, recognised without running it:
a check answers "not written yet" at once instead of starting ranks that could only raise."""

import dis
import types

# What `def f(...): """doc"""; raise NotImplementedError("Hint: ...")` compiles to (3.10-3.13).
_STUB_OPS = {"RESUME", "NOP", "CACHE", "LOAD_GLOBAL", "LOAD_CONST", "PUSH_NULL", "PRECALL", "CALL",
             "CALL_FUNCTION", "RAISE_VARARGS", "COPY_FREE_VARS", "MAKE_CELL"}


def stub_message(fn):
    """The message of a plain function whose body only raises NotImplementedError with a
    constant text, the stub `dlcourse exercises build` writes (the text empty or a "Hint: ...");
    None for anything else. Such a function can do nothing but raise, whatever it is given, so
    a check can say that it is not written yet without starting ranks."""
    if not isinstance(fn, types.FunctionType) or fn.__code__.co_names != ("NotImplementedError",):
        return None
    instructions = list(dis.get_instructions(fn.__code__))
    if not {i.opname for i in instructions} <= _STUB_OPS:
        return None
    texts = [i.argval for i in instructions if i.opname == "LOAD_CONST"]
    if len(texts) > 1 or not all(isinstance(t, str) for t in texts):
        return None
    message = texts[0] if texts else ""
    return message if is_stub_text(message) else None


def is_stub_text(message):
    return not message or message.startswith("Hint:")


def not_written(exercise, message):
    return (f"{exercise} is not written yet: replace its `raise NotImplementedError` line "
            f"with your code. {message}").rstrip()
