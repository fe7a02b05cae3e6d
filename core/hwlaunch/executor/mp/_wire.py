"""How the mp executor's calls and replies are laid out: pickle protocol 5, buffers apart.

Why: an engine sends tensors and byte strings on every step. Plain ``pickle.dumps`` copies each
one into the pickle, the channel copies the pickle into shared memory, and ``pickle.loads``
copies it out again; torch's own pickling adds a storage pickle on top. Here a large payload is
copied once on each side, as a raw memory copy would be:

- **out-of-band buffers** (``pickle.PickleBuffer``, ``buffer_callback``): a numpy array, a CPU
  torch tensor and a ``memoryview`` hand their memory to the pickler as a buffer, which the
  channel copies straight from the object's memory into shared memory;
- **large byte strings** (64 KiB and more: ``bytes``, ``bytearray``): the C pickler hands them
  to its file's ``write`` as the object itself, outside its own buffer; :class:`Frame` keeps the
  reference and the channel copies from it, so they are not copied into a pickle first either.

The receiving side decodes in place, from a view of shared memory: the unpickler copies each
large byte string once into the new object, and every out-of-band buffer is copied once into
memory of its own (a torch tensor straight into a new tensor, anything else into a
``bytearray`` that a numpy array then views). Nothing that the caller or the worker receives
views shared memory, so the channel may reuse it as soon as decoding ends.

A frame's layout, from an offset aligned to 64 bytes: the stream length and the buffer count,
per buffer its length and whether this module's own rebuild function copies it, the pickle
stream, then each buffer from a 64-byte boundary.
"""

from __future__ import annotations

import ctypes
import pickle
import struct
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle

from hwlaunch.executor._runtime import Failure

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
# memoryview formats a received view can be cast back to (struct's native single characters).
_CASTABLE = frozenset("bBhHiIlLqQnNefd?cP")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Frame:
    """One encoded message: the pickle stream in pieces, and its out-of-band buffers.

    ``write_into`` lays it out at an offset of a writable buffer (shared memory); the pieces
    and buffers are references to the caller's objects until then, so a frame is written once,
    right after it is made.
    """

    __slots__ = ("buffers", "copies", "keep", "parts", "size", "stream_size")

    def __init__(self) -> None:
        self.parts: list[Any] = []  # bytes, bytearray or PickleBuffer: the stream, in order
        self.stream_size = 0
        self.buffers: list[memoryview] = []  # out-of-band, each flat ("B")
        self.copies: list[bool] = []  # True: this module's rebuild function copies the buffer
        self.keep: list[Any] = []  # owners of buffers that view memory without holding it
        self.size = 0

    def write(self, data: Any) -> int:
        """The pickler's file: keep a reference to what it writes (large payloads whole)."""
        n = len(data) if isinstance(data, _BYTES) else memoryview(data).nbytes
        self.parts.append(data)
        self.stream_size += n
        return n

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

    def to_bytes(self) -> bytearray:
        """The frame as one buffer (for a pipe, which takes whole messages)."""
        out = bytearray(self.size)
        self.write_into(out, 0)
        return out


# -- encoding ----------------------------------------------------------------------------
def _tensor_from(data: memoryview, dtype: Any, shape: tuple[int, ...], grad: bool) -> Any:
    """A new CPU tensor holding a copy of ``data`` (a view that stays valid only for the call).

    Two torch calls at most (``frombuffer``; ``view`` for a shape of other than one dimension):
    right after a megabyte has been copied, the processor's caches hold none of torch's code,
    and each torch call then costs some 10 to 40 µs, more than the rest of the decoding. The
    memory is a ``bytearray``'s (one ``memcpy``, and the allocator's freed memory reused, where
    a fresh ``torch.empty`` of a megabyte faults in new pages on every call). Such a tensor
    cannot be resized in place (``resize_``), like ``torch.frombuffer``'s.
    """
    import torch

    if data.nbytes:
        out = torch.frombuffer(bytearray(data), dtype=dtype)
        if len(shape) != 1:
            out = out.view(shape)
    else:
        out = torch.empty(shape, dtype=dtype)
    return out.requires_grad_() if grad else out


def _memoryview_from(data: memoryview, fmt: str, shape: tuple[int, ...], readonly: bool) -> Any:
    whole: Any = memoryview(bytearray(data))  # Any: the format is known at run time only
    flat = whole.cast(fmt)
    view: Any
    if not shape:  # 0-d: ``cast`` makes none; a slice of one element, cast to no dimension
        view = flat[0:1].cast("B").cast(fmt, [])
    elif len(shape) == 1:
        view = flat
    elif 0 not in shape:
        view = flat.cast("B").cast(fmt, shape)
    else:  # empty in more than one dimension: no cast makes that shape, numpy's view does
        import numpy

        empty: Any = numpy.empty(shape, dtype=fmt)
        view = memoryview(empty)
    return view.toreadonly() if readonly else view


def _reduce_tensor(tensor: Any, torch: Any, keep: list[Any]) -> tuple[Any, ...] | None:
    """A CPU tensor's memory as one out-of-band buffer; None: torch's own pickling.

    Kept by torch (None): subclasses (``nn.Parameter``), other devices, sparse or quantized
    tensors, and non-leaf tensors that require grad (torch refuses those). A contiguous
    tensor's memory is handed over where it lies, found with getters only (no torch operation:
    see :func:`_tensor_from`); ``keep`` holds the tensor until the frame is written.
    """
    dtype = tensor.dtype
    if (
        not tensor.is_cpu
        or tensor.layout is not torch.strided
        or dtype in _quantized(torch)
        or (tensor.requires_grad and not tensor.is_leaf)
    ):
        return None
    if tensor.is_neg() or (dtype.is_complex and tensor.is_conj()):
        tensor = tensor.resolve_conj().resolve_neg()
    shape = tuple(tensor.shape)
    try:
        raw = _memory_of(tensor, torch, keep)
    except (RuntimeError, TypeError, ImportError):  # no numpy
        return None
    return _tensor_from, (raw, dtype, shape, tensor.requires_grad)


def _memory_of(tensor: Any, torch: Any, keep: list[Any]) -> Any:
    """The tensor's elements as flat bytes, in order: its own memory when it is contiguous,
    else one copy made by numpy. Not torch's ``contiguous()``: a large copy there is a
    parallel operation, which starts torch's OpenMP pool in the caller's process, and a
    process with that pool can no longer fork workers safely."""
    if tensor.is_contiguous():
        keep.append(tensor)
        return _view_memory(tensor.data_ptr(), tensor.nbytes, _READ)
    import numpy

    same_size = _SAME_SIZE_INTS.get(tensor.element_size())
    if same_size is None:  # 16-byte elements (complex128): no numpy integer of that size
        return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    ints = tensor.detach().view(getattr(torch, same_size)).numpy()  # the same strides
    return numpy.ascontiguousarray(ints).reshape(-1).view(numpy.uint8)


_SAME_SIZE_INTS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
# A memoryview of raw memory (no owner: the frame keeps the tensor that owns it).
_view_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_view_memory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_view_memory.restype = ctypes.py_object
_READ = 0x100  # PyBUF_READ
_QUANTIZED: frozenset[Any] | None = None


def _quantized(torch: Any) -> frozenset[Any]:
    global _QUANTIZED
    if _QUANTIZED is None:
        names = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
        _QUANTIZED = frozenset(getattr(torch, n) for n in names if hasattr(torch, n))
    return _QUANTIZED


def _reduce_memoryview(view: memoryview) -> tuple[Any, ...] | None:
    if view.format not in _CASTABLE:
        return None  # pickle's own error: a memoryview cannot be pickled
    flat = view.cast("B") if view.c_contiguous and view.nbytes else memoryview(view.tobytes())
    return _memoryview_from, (flat, view.format, view.shape, view.readonly)


class _Encoder:
    """What both picklers share: the reducers, and every buffer out of band."""

    ours: dict[int, pickle.PickleBuffer]  # the buffers our reducers made (kept: ids stay unique)
    keep: list[Any]  # what owns the memory of a buffer that does not hold its owner

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        reduced: tuple[Any, ...] | None = None
        if cls is memoryview:
            reduced = _reduce_memoryview(obj)
        else:
            torch = sys.modules.get("torch")
            numpy = sys.modules.get("numpy")
            if torch is not None and cls is torch.Tensor:
                reduced = _reduce_tensor(obj, torch, self.keep)
            elif numpy is not None and cls is numpy.ndarray and _scattered(obj):
                # Contiguous once; numpy's own reduction then hands its memory over.
                return numpy.ascontiguousarray(obj).__reduce_ex__(5)
        if reduced is None:
            return self.fallback(obj)
        rebuild, (data, *rest) = reduced
        buffer = pickle.PickleBuffer(data)
        self.ours[id(buffer)] = buffer
        return rebuild, (buffer, *rest)

    def fallback(self, obj: Any) -> Any:
        return NotImplemented


def _scattered(array: Any) -> bool:
    """A numpy array whose memory numpy cannot hand over as one buffer (a strided view)."""
    flags = array.flags
    return not (flags.c_contiguous or flags.f_contiguous) and not array.dtype.hasobject


class _Plain(_Encoder, pickle.Pickler):
    pass


class _ByValue(_Encoder, cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle (a lambda or a class of ``__main__`` among the arguments or in a result),
    with the same buffers apart."""

    def fallback(self, obj: Any) -> Any:
        return cloudpickle.Pickler.reducer_override(self, obj)


def _dump(pickler_class: type[_Plain] | type[_ByValue], obj: Any) -> Frame:
    frame, ours = Frame(), dict[int, pickle.PickleBuffer]()

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        """Every buffer travels out of band, copied from where it lies when the frame is
        written; the ones our reducers made are copied by their rebuild functions."""
        frame.buffers.append(buffer.raw())
        frame.copies.append(id(buffer) in ours)
        return False

    pickler = pickler_class(frame, protocol=5, buffer_callback=out_of_band)
    pickler.ours = ours
    pickler.keep = frame.keep
    pickler.dump(obj)
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


def encode_call(call: tuple[Any, Any, Any]) -> Frame | bytes:
    """A request ``(method name or None, args, kwargs)``; one without arguments (a named
    no-op, a cached callable's call) as a plain pickle at once, without a look inside."""
    method, args, kwargs = call
    if type(args) is tuple and type(kwargs) is dict and not args and not kwargs:  # noqa: SIM102
        if type(method) in _ATOMS:
            return pickle.dumps(call, protocol=5)
    return encode(call)


def encode_reply(reply: tuple[Any, ...]) -> Frame | bytes:
    """``(rpc_id, ok, value)``: a value that is an atom (None, a number) as a plain pickle at
    once, without a look inside (the prefix is atoms)."""
    if type(reply[-1]) in _ATOMS:
        return pickle.dumps(reply, protocol=5)
    return encode(reply)


# -- decoding ----------------------------------------------------------------------------
def _buffers(view: memoryview, at: int, entries: list[tuple[int, int]]) -> Iterator[Any]:
    """The out-of-band buffers, in order: a view of shared memory where this module's rebuild
    function copies it, else a copy of its own (numpy's arrays view what they are given)."""
    for length, copies in entries:
        at = align(at)
        piece = view[at : at + length]
        yield piece if copies else bytearray(piece)
        at += length


def decode(view: memoryview | bytes) -> Any:
    """The object a message body (``view``, from a 64-byte boundary, or a small one's copy)
    holds; views of ``view`` given out while decoding are released before this returns."""
    if view[0] != FRAME_BYTE:
        return pickle.loads(view)
    if not isinstance(view, memoryview):
        view = memoryview(view)
    _, count, stream_size = _HEADER.unpack_from(view, 0)
    pos = _HEADER.size
    entries = []
    for _ in range(count):
        entries.append(_ENTRY.unpack_from(view, pos))
        pos += _ENTRY.size
    given: list[Any] = []
    try:
        with view[pos : pos + stream_size] as stream:
            buffers = _kept(_buffers(view, pos + stream_size, entries), given)
            return pickle.loads(stream, buffers=buffers)
    finally:
        for piece in given:
            if isinstance(piece, memoryview):
                piece.release()


def _kept(pieces: Iterator[Any], given: list[Any]) -> Iterator[Any]:
    for piece in pieces:
        given.append(piece)
        yield piece


def decode_reply(view: memoryview | bytes) -> tuple[int | None, bool, Any]:
    """``(rpc_id, ok, value)``; a reply that cannot be decoded here (e.g. a result whose class
    the parent cannot import) is a Failure of the call it answers."""
    try:
        reply: tuple[int, bool, Any]
        # A plain pickle (the usual small reply) without the call to decode().
        reply = pickle.loads(view) if view[0] != FRAME_BYTE else decode(view)
        return reply
    except Exception as exc:
        return None, False, Failure.current(exc)
