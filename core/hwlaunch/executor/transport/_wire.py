"""How the mp executor's calls and replies are laid out: pickle protocol 5, buffers apart.

Why: an engine sends tensors and byte strings on every step. Plain ``pickle.dumps`` copies each
one into the pickle, the channel copies the pickle into shared memory, and ``pickle.loads``
copies it out again; torch's own pickling adds a storage pickle on top. Here a large payload is
copied once on each side, as a raw memory copy would be:

- **out-of-band buffers** (``pickle.PickleBuffer``, ``buffer_callback``): a numpy array, a CPU
  torch tensor and a ``memoryview`` hand their memory to the pickler as a buffer
  (``hwlaunch.executor.transport._reductions``), which the channel copies straight from the object's
  memory into shared memory;
- **large byte strings** (64 KiB and more: ``bytes``, ``bytearray``): the C pickler hands them
  to its file's ``write`` as the object itself, outside its own buffer; :class:`Frame` keeps the
  reference and the channel copies from it, so they are not copied into a pickle first either.

The receiving side decodes in place, from a view of shared memory: the unpickler copies each
large byte string once into the new object, and every out-of-band buffer is copied once into
memory of its own (a ``bytearray`` that the tensor, numpy array or memoryview rebuilt from it
then uses), so the channel may reuse the shared memory as soon as decoding ends. Except where
the caller lends it (``decode(view, lent)``: the parent's replies, and the requests of a
channel's only reader, see ``ShmChannel``): tensors then view it where they lie.

A frame's layout, from an offset aligned to 64 bytes: the stream length and the buffer count,
per buffer its length and whether this module's own rebuild function copies it, the pickle
stream, then each buffer from a 64-byte boundary.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, ClassVar

import cloudpickle

from hwlaunch.executor._runtime import Failure
from hwlaunch.executor.transport._reductions import (
    DUMPING,
    LENDING,
    by_value_reduction,
    dispatch_table,
)

__all__ = [
    "ALIGN",
    "FRAME_BYTE",
    "Frame",
    "align",
    "decode",
    "decode_reply",
    "encode",
    "encode_call",
    "encode_reply",
]

Buffer = bytes | bytearray | memoryview
ALIGN = 64
_HEADER = struct.Struct("<cxxxIQ")  # FRAME, buffer count, stream length
FRAME = b"F"  # a plain pickle (the usual small call or reply) starts with PROTO (0x80) instead
FRAME_BYTE = FRAME[0]
_BYTES = (bytes, bytearray)
_ENTRY = struct.Struct("<QB")  # buffer length, 1: the rebuild function copies it itself


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Frame:
    """One encoded message: the pickle stream in pieces, and its out-of-band buffers.

    ``write_into`` lays it out at an offset of a writable buffer (shared memory); the pieces
    and buffers are references to the caller's objects until then, so a frame is written once,
    right after it is made.
    """

    __slots__ = ("buffers", "copies", "keep", "ours", "parts", "size", "stream_size")

    def __init__(self) -> None:
        self.parts: list[Any] = []  # bytes, bytearray or PickleBuffer: the stream, in order
        self.stream_size = 0
        self.buffers: list[memoryview] = []  # out-of-band, each flat ("B")
        self.copies: list[bool] = []  # True: this module's rebuild function copies the buffer
        self.keep: list[Any] = []  # owners of buffers that view memory without holding it
        self.ours: dict[int, pickle.PickleBuffer] = {}  # made by _reductions (kept: ids unique)
        self.size = 0

    def write(self, data: Any) -> int:
        """The pickler's file: keep a reference to what it writes (large payloads whole)."""
        n = len(data) if isinstance(data, _BYTES) else memoryview(data).nbytes
        self.parts.append(data)
        self.stream_size += n
        return n

    def out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        """The pickler's ``buffer_callback``: every buffer travels out of band, copied from
        where it lies when the frame is written; the ones ``_reductions`` made are copied by
        their rebuild functions."""
        self.buffers.append(buffer.raw())
        self.copies.append(id(buffer) in self.ours)
        return False

    def _layout(self) -> int:
        end = _HEADER.size + _ENTRY.size * len(self.buffers) + self.stream_size
        for buffer in self.buffers:
            end = align(end) + buffer.nbytes
        return end

    def write_into(self, memory: Any, at: int) -> None:
        """Lay the frame out at ``memory[at:]`` (``at`` 64-byte aligned, room for ``size``)."""
        buffers = self.buffers
        _HEADER.pack_into(memory, at, FRAME, len(buffers), self.stream_size)
        pos = at + _HEADER.size
        for buffer, copies in zip(buffers, self.copies, strict=True):
            _ENTRY.pack_into(memory, pos, buffer.nbytes, copies)
            pos += _ENTRY.size
        for part in self.parts:
            n = len(part) if isinstance(part, _BYTES) else memoryview(part).nbytes
            memory[pos : pos + n] = part
            pos += n
        for buffer in buffers:
            pos = at + align(pos - at)
            memory[pos : pos + buffer.nbytes] = buffer
            pos += buffer.nbytes

    def drop(self) -> None:
        """Let go of the objects the frame references (once it is written)."""
        self.parts, self.buffers, self.keep = [], [], []
        self.ours = {}

    def to_bytes(self) -> bytearray:
        """The frame as one buffer (for a pipe, which takes whole messages)."""
        out = bytearray(self.size)
        self.write_into(out, 0)
        return out


# -- encoding ----------------------------------------------------------------------------
class _Plain(pickle.Pickler):
    """Plain pickle; the reducers of ``_reductions`` sit in its ``dispatch_table``, which
    :func:`_dump` renews when ``_reductions`` made it anew (it follows copyreg's)."""

    dispatch_table: ClassVar[dict[type, Any]] = {}  # type: ignore[misc]


class _ByValue(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle (a lambda or a class of ``__main__`` among the arguments or in a result),
    with the same buffers apart."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = by_value_reduction(obj)
        return cloudpickle.Pickler.reducer_override(self, obj) if reduced is None else reduced


def _dump(pickler_class: type[_Plain] | type[_ByValue], obj: Any) -> Frame:
    frame = Frame()
    table = dispatch_table()
    if _Plain.dispatch_table is not table:  # a class attribute: the pickler reads it once
        _Plain.dispatch_table = table
    DUMPING.ours, DUMPING.keep = frame.ours, frame.keep
    try:
        pickler = pickler_class(frame, protocol=5, buffer_callback=frame.out_of_band)
        pickler.dump(obj)
    finally:
        DUMPING.ours = DUMPING.keep = None  # the thread keeps nothing of the message
    frame.size = frame._layout()
    return frame


_ATOMS = frozenset((int, float, str, bool, type(None)))
_EMPTY = frozenset((tuple, list, dict))  # empty, simple without a look inside
_SMALL = 64 * 1024  # a byte string below this is copied into the pickler's own buffer anyway


def _simple(obj: Any, depth: int) -> bool:
    """Nothing in ``obj`` (nested ``depth`` deep) needs a reducer or a by-reference write:
    atoms, small byte strings, and tuples, lists and dicts of them."""
    cls = type(obj)
    if cls in _ATOMS:
        return True
    if cls is bytes:
        return len(obj) < _SMALL
    if depth == 0:
        return False
    # Loops, atoms and empty containers first, no generators: this runs on every call and
    # reply (a call by name with no arguments is a str, an empty tuple and an empty dict).
    if cls is tuple or cls is list:
        for item in obj:
            kind = type(item)
            if (
                kind not in _ATOMS
                and not (kind in _EMPTY and not item)
                and not _simple(item, depth - 1)
            ):
                return False
        return True
    if cls is dict:
        for key, value in obj.items():
            kind = type(value)
            if type(key) is not str or (
                kind not in _ATOMS
                and not (kind in _EMPTY and not value)
                and not _simple(value, depth - 1)
            ):
                return False
        return True
    return False


def encode(obj: Any) -> Frame | bytes:
    """``obj`` as a frame, or as a plain pickle where nothing in it needs a reducer (the usual
    small call or reply: a few atoms); cloudpickle for what plain pickle cannot take by value.
    """
    if _simple(obj, 3):
        return pickle.dumps(obj, protocol=5)
    try:
        return _dump(_Plain, obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return _dump(_ByValue, obj)


_WITHOUT_ARGUMENTS: dict[str | None, bytes] = {}  # a method name's call without arguments
_KEPT_NAMES = 1024


def encode_call(call: tuple[Any, Any, Any]) -> Frame | bytes:
    """A request ``(method name or None, args, kwargs)``; one without arguments (a named
    no-op, a cached callable's call) as a plain pickle at once, without a look inside, made
    once per method name."""
    method, args, kwargs = call
    if type(args) is tuple and type(kwargs) is dict and not args and not kwargs:
        kind = type(method)
        if kind is str or method is None:
            payload = _WITHOUT_ARGUMENTS.get(method)
            if payload is None:
                payload = pickle.dumps(call, protocol=5)
                if len(_WITHOUT_ARGUMENTS) < _KEPT_NAMES:
                    _WITHOUT_ARGUMENTS[method] = payload
            return payload
        if kind in _ATOMS:
            return pickle.dumps(call, protocol=5)
    return encode(call)


def encode_reply(reply: tuple[Any, ...]) -> Frame | bytes:
    """``(rpc_id, ok, value)``: a value that is an atom (None, a number) as a plain pickle at
    once, without a look inside (the prefix is atoms)."""
    if type(reply[-1]) in _ATOMS:
        return pickle.dumps(reply, protocol=5)
    return encode(reply)


# -- decoding ----------------------------------------------------------------------------
def _buffers(view: memoryview, pos: int, count: int, at: int, pieces: list[Any]) -> None:
    """Append to ``pieces`` the ``count`` out-of-band buffers whose entries start at ``pos``,
    their data at ``at`` (rounded up to 64 bytes each): a view of ``view`` where this module's
    rebuild function copies it (or, lent, keeps it), else a copy of its own (numpy's arrays
    view what they are given, through a view of their own that a lender cannot follow). Each
    view is in ``pieces`` as soon as it is made, so that the caller releases it whatever
    happens next."""
    for _ in range(count):
        length, copies = _ENTRY.unpack_from(view, pos)
        pos += _ENTRY.size
        at = align(at)
        piece: Any = view[at : at + length]
        if not copies:
            with piece:
                piece = bytearray(piece)
        pieces.append(piece)
        at += length


def decode(view: memoryview | bytes, lent: list[memoryview] | None = None) -> Any:
    """The object a message body (``view``, from a 64-byte boundary, or a small one's copy)
    holds. Views of ``view`` given out while decoding are released before this returns;
    with ``lent`` (a list), the memory of ``view`` is lent instead: tensors view it where
    they lie (``torch.frombuffer`` references the view it is given, for as long as any tensor
    uses the memory), and every view given out goes into ``lent``, where the caller sees which
    ones are still referenced (see ``ShmChannel``)."""
    if view[0] != FRAME_BYTE:
        return pickle.loads(view)
    if not isinstance(view, memoryview):
        view = memoryview(view)
    _, count, stream_size = _HEADER.unpack_from(view, 0)
    pos = _HEADER.size + _ENTRY.size * count
    pieces: list[Any] = []
    LENDING.on = lent is not None
    try:
        _buffers(view, _HEADER.size, count, pos + stream_size, pieces)
        with view[pos : pos + stream_size] as stream:
            return pickle.loads(stream, buffers=pieces)
    finally:
        LENDING.on = False
        for piece in pieces:
            if type(piece) is memoryview:
                if lent is None:
                    piece.release()
                else:
                    lent.append(piece)


def decode_reply(
    view: memoryview | bytes, lent: list[memoryview] | None = None
) -> tuple[int | None, bool, Any]:
    """``(rpc_id, ok, value)``; a reply that cannot be decoded here (e.g. a result whose class
    the parent cannot import) is a Failure of the call it answers. ``lent``: see decode()."""
    try:
        reply: tuple[int, bool, Any]
        # A plain pickle (the usual small reply) without the call to decode().
        reply = pickle.loads(view) if view[0] != FRAME_BYTE else decode(view, lent)
        return reply
    except Exception as exc:
        return None, False, Failure.current(exc, undecodable=True)
