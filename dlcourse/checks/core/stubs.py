"""The stub `dlcourse exercises build` writes for an exercise, recognised without running it:
a check answers "not written yet" at once instead of starting ranks that could only raise; and
recognised where it raised (`stub_raising`), so that an exercise that calls another one still
unwritten (lesson 10's name_the_bug calls first_divergence) names that one."""

import dis
import types

from dlcourse import i18n

# What `def f(...): """doc"""; raise NotImplementedError("Hint: ...")` compiles to (3.10-3.13).
_STUB_OPS = {"RESUME", "NOP", "CACHE", "LOAD_GLOBAL", "LOAD_CONST", "PUSH_NULL", "PRECALL", "CALL",
             "CALL_FUNCTION", "RAISE_VARARGS", "COPY_FREE_VARS", "MAKE_CELL"}


def stub_message(fn):
    """The message of a plain function whose body only raises NotImplementedError with a
    constant text, the stub `dlcourse exercises build` writes (the text empty or a "Hint: ...");
    None for anything else. Such a function can do nothing but raise, whatever it is given, so
    a check can say that it is not written yet without starting ranks."""
    if not isinstance(fn, types.FunctionType):
        return None
    return _stub_text(fn.__code__)


def _stub_text(code):
    if code.co_names != ("NotImplementedError",):
        return None
    instructions = list(dis.get_instructions(code))
    if not {i.opname for i in instructions} <= _STUB_OPS:
        return None
    texts = [i.argval for i in instructions if i.opname == "LOAD_CONST"]
    if len(texts) > 1 or not all(isinstance(t, str) for t in texts):
        return None
    message = texts[0] if texts else ""
    return message if is_stub_text(message) else None


def is_stub_text(message):
    return not message or message.startswith("Hint:")


def stub_raising(error):
    """The name of the stub whose `raise NotImplementedError` raised `error` (the innermost
    frame of its traceback, when that frame's code is a stub's as `stub_message` reads it), or
    None."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or _stub_text(tb.tb_frame.f_code) is None:
        return None
    return tb.tb_frame.f_code.co_name


class NotWritten(NotImplementedError):
    """Raised in a rank instead of a stub's NotImplementedError that a student's function
    reached by calling another exercise's function: its message names the stub."""


def not_written(exercise, message, caller=None):
    if i18n.language() == "zh":
        return _not_written_zh(exercise, message, caller)
    called = f" ({caller} calls it)" if caller and caller != exercise else ""
    return (f"{exercise} is not written yet{called}: replace its `raise NotImplementedError` "
            f"line with your code. {message}").rstrip()


def _not_written_zh(exercise, message, caller):
    """`not_written` in Chinese: the stub's "Hint: ..." is hint level 1, taken from the
    exercise's catalogue when it has a current translation."""
    called = f"（{caller} 调用了它）" if caller and caller != exercise else ""
    hint = message[len("Hint:"):].strip() if message.startswith("Hint:") else ""
    hint = i18n.hint_text(exercise, 1, hint) if hint else ""
    return (f"{exercise} 还没有写{called}：把它的 `raise NotImplementedError` 这一行换成你的代码。"
            + (f"提示：{hint}" if hint else ""))
