"""Main guards read from bytecode, for a ``.pyc`` main whose source is gone or was changed.

Why: ``python app.pyc`` re-runs ``app.pyc`` in every spawned child, whatever became of the
source, and the code it re-runs is at hand: the running module frame's own code object. There,
``if __name__ == "__main__":`` is a compare of ``__name__`` with ``"__main__"`` followed by a
jump past the body when it is false. An instruction runs only as ``__main__`` when no path from
the start of the module reaches it once each such jump is taken as if the test were false (in a
child, ``__name__`` is ``"__mp_main__"``). Paths follow every jump, fall-through and exception
handler, so a body that a handler or a loop enters another way is not trusted; an opcode not
known to end a path is taken to fall through, which can only make fewer lines guarded.
Opcode names differ between CPython versions (``POP_JUMP_FORWARD_IF_FALSE`` in 3.11,
``bool(==)`` compares and ``TO_BOOL`` from 3.13); ``dis`` gives every jump target as a byte
offset in all of them.
"""

from __future__ import annotations

import dis
import itertools
from types import CodeType

_JUMPS_IF_FALSE = ("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE")
_EQUALS = ("==", "bool(==)")
_BETWEEN = ("TO_BOOL", "EXTENDED_ARG", "NOT_TAKEN")
_OPERANDS = {("LOAD_NAME", "__name__"), ("LOAD_CONST", "__main__")}
_ALWAYS_JUMP = (
    "JUMP",
    "JUMP_ABSOLUTE",
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_NO_INTERRUPT",
    "JUMP_BACKWARD_NO_INTERRUPT",
)
_END_PATH = ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE")


def offset_is_guarded(code: CodeType, offset: int) -> bool:
    """Whether the instruction at byte ``offset`` of module ``code`` runs only as ``__main__``.

    ``offset`` is a frame's ``f_lasti``, which in 3.11 may point into the inline cache after
    the running instruction: the instruction is the last one that starts at or before it.
    """
    instructions = list(dis.get_instructions(code))
    running = [i.offset for i in instructions if i.offset <= offset]
    guards = _guard_jumps(instructions)
    if not (running and guards):
        return False
    return running[-1] not in _reachable(code, instructions, guards)


def _guard_jumps(instructions: list[dis.Instruction]) -> set[int]:
    """Offsets of the jumps that skip an ``if __name__ == "__main__":`` body."""
    found = set()
    code = [i for i in instructions if i.opname not in _BETWEEN]
    for at in range(2, len(code) - 1):
        compare, jump = code[at], code[at + 1]
        if compare.opname != "COMPARE_OP" or compare.argrepr not in _EQUALS:
            continue
        operands = {(i.opname, i.argval) for i in code[at - 2 : at]}
        if operands == _OPERANDS and jump.opname in _JUMPS_IF_FALSE:
            found.add(jump.offset)
    return found


def _reachable(code: CodeType, instructions: list[dis.Instruction], guards: set[int]) -> set[int]:
    """Offsets reachable from the module's start with every guard jump always taken."""
    after = {a.offset: b.offset for a, b in itertools.pairwise(instructions)}
    # From 3.11, exception handlers are a table beside the code, not instructions.
    handlers = getattr(dis.Bytecode(code), "exception_entries", ())
    by_offset = {i.offset: i for i in instructions}
    seen: set[int] = set()
    todo = [instructions[0].offset]
    while todo:
        offset = todo.pop()
        if offset in seen or offset not in by_offset:
            continue
        seen.add(offset)
        instruction = by_offset[offset]
        jumps = instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs
        if jumps and isinstance(instruction.argval, int):
            todo.append(instruction.argval)
        ends = instruction.opname in _ALWAYS_JUMP or instruction.opname in _END_PATH
        if offset in after and not ends and offset not in guards:
            todo.append(after[offset])
        todo.extend(h.target for h in handlers if h.start <= offset < h.end)
    return seen
