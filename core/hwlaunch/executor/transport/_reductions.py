"""How the wire (``hwlaunch.executor.transport._wire``) takes tensors, arrays and memoryviews apart.

Each kind of payload hands its memory to the pickler as one out-of-band buffer, and is rebuilt
on the other side by a function of this module that copies the buffer once (the view it gets
is valid only while the message is decoded).

The reducers sit in the plain pickler's ``dispatch_table`` (:func:`dispatch_table`), keyed by
exact type, so the C pickler calls Python only for the objects they take: not for every other
object of a message (a function, a dtype), as a ``reducer_override`` would be. What they hand
over goes to :class:`Dumping`, the message being made on this thread.

Why the tensor path avoids torch operations: right after a megabyte has been copied, the
processor's caches hold none of torch's code, and each torch operation (``detach``,
``reshape``, ``view``, ``numpy``) then costs some 10 to 40 µs, more than the rest of a
message's encoding; a getter (``is_contiguous``, ``data_ptr``) costs well under one.
"""

from __future__ import annotations

import copyreg
import ctypes
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "DUMPING",
    "LENDING",
    "Dumping",
    "Lending",
    "by_value_reduction",
    "dispatch_table",
    "memoryview_from",
    "tensor_from",
]

# memoryview formats a received view can be cast back to (struct's native single characters).
_CASTABLE = frozenset("bBhHiIlLqQnNefd?cP")
_SAME_SIZE_INTS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_QUANTIZED_NAMES = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
# A memoryview of raw memory, with no owner: the message keeps the tensor that owns it.
_view_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_view_memory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_view_memory.restype = ctypes.py_object
# Writable, though the frame only reads it: a read-only buffer is unpickled as a view of its
# own, which a lender could not follow (a lent tensor must reference the view it was given).
_WRITE = 0x200  # PyBUF_WRITE


class Dumping(threading.local):
    """The message being encoded on this thread: the buffers the reducers made (their
    rebuild functions copy them; kept, so that their ids stay unique) and the objects that
    own memory a buffer views without holding it."""

    ours: Any = None  # dict[int, pickle.PickleBuffer] while a message is made
    keep: Any = None  # list[Any] likewise


DUMPING = Dumping()


class Lending(threading.local):
    """Whether the message decoded on this thread lends its memory: a rebuilt tensor then
    views the buffer it is given instead of copying it (see ``ShmChannel``'s replies)."""

    on = False


LENDING = Lending()


def _ours(rebuild: Callable[..., Any], data: Any, *rest: Any) -> tuple[Any, ...]:
    buffer = pickle.PickleBuffer(data)
    DUMPING.ours[id(buffer)] = buffer
    return rebuild, (buffer, *rest)


# -- tensors -------------------------------------------------------------------------------------
def tensor_from(data: memoryview, dtype: str, shape: tuple[int, ...], grad: bool) -> Any:
    """A new CPU tensor holding a copy of ``data``, or viewing it where the message lends its
    memory (:data:`LENDING`): two torch calls at most (``frombuffer``; ``view`` for a shape of
    other than one dimension). A copy's memory is a ``bytearray``'s (one ``memcpy``, into
    memory the allocator reuses, where a fresh ``torch.empty`` of a megabyte faults in new
    pages on every call). Such a tensor cannot be resized in place (``resize_``), like
    ``torch.frombuffer``'s."""
    import torch

    kind = getattr(torch, dtype)
    if data.nbytes:
        lend = LENDING.on and type(data) is memoryview and not data.readonly
        out = torch.frombuffer(data if lend else bytearray(data), dtype=kind)
        if len(shape) != 1:
            out = out.view(shape)
    else:
        out = torch.empty(shape, dtype=kind)
    return out.requires_grad_() if grad else out


def _tensor_reduction(tensor: Any) -> Any:
    """A CPU tensor's memory as one out-of-band buffer, else torch's own pickling.

    Kept by torch: subclasses (``nn.Parameter``: not this exact type), other devices, sparse
    or quantized tensors, and non-leaf tensors that require grad (torch refuses those). A
    contiguous tensor's memory is handed over where it lies, found with getters only (each
    read once: this runs for every tensor of every message).
    """
    dtype = tensor.dtype
    name = _dtype_names.get(dtype)
    if name is None:
        name = _learn_dtype(dtype)
    grad = tensor.requires_grad
    if (
        not name
        or not tensor.is_cpu
        or tensor.layout is not _strided
        or (grad and not tensor.is_leaf)
    ):
        return tensor.__reduce_ex__(5)
    if tensor.is_neg() or (dtype.is_complex and tensor.is_conj()):
        tensor = tensor.resolve_conj().resolve_neg()
    if tensor.is_contiguous():
        DUMPING.keep.append(tensor)
        raw = _view_memory(tensor.data_ptr(), tensor.nbytes, _WRITE)
    else:
        try:
            raw = _strided_copy(tensor, sys.modules["torch"])
        except (RuntimeError, TypeError, ImportError):  # no numpy
            return tensor.__reduce_ex__(5)
    buffer = pickle.PickleBuffer(raw)
    DUMPING.ours[id(buffer)] = buffer
    return tensor_from, (buffer, name, tuple(tensor.shape), grad)


def _strided_copy(tensor: Any, torch: Any) -> Any:
    """A strided tensor's elements as flat bytes, in order: one copy made by numpy. Not
    torch's ``contiguous()``: a large copy there is a parallel operation, which starts torch's
    OpenMP pool in the caller's process, and a process with that pool can no longer fork
    workers safely."""
    import numpy

    same_size = _SAME_SIZE_INTS.get(tensor.element_size())
    if same_size is None:  # 16-byte elements (complex128): no numpy integer of that size
        return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    ints = tensor.detach().view(getattr(torch, same_size)).numpy()  # the same strides
    return numpy.ascontiguousarray(ints).reshape(-1).view(numpy.uint8)


_dtype_names: dict[Any, str] = {}  # dtype: its name (``float32``), "" for a quantized one
_strided: Any = None  # torch.strided, once the table takes tensors


def _learn_dtype(dtype: Any) -> str:
    """``float32`` for ``torch.float32`` (a string pickles without a global lookup), or ""
    for a quantized dtype, which torch's own pickling takes."""
    name = str(dtype).removeprefix("torch.")
    _dtype_names[dtype] = "" if name in _QUANTIZED_NAMES else name
    return _dtype_names[dtype]


# -- memoryviews and numpy arrays ----------------------------------------------------------------
def memoryview_from(data: memoryview, fmt: str, shape: tuple[int, ...], readonly: bool) -> Any:
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


def _memoryview_reduction(view: memoryview) -> Any:
    if view.format not in _CASTABLE:
        return view.__reduce_ex__(5)  # pickle's own error: a memoryview cannot be pickled
    flat = view.cast("B") if view.c_contiguous and view.nbytes else memoryview(view.tobytes())
    return _ours(memoryview_from, flat, view.format, view.shape, view.readonly)


def _ndarray_reduction(array: Any) -> Any:
    """numpy's own reduction (its memory as a buffer), of a contiguous copy where the array
    is a strided view whose memory numpy cannot hand over as one buffer."""
    flags = array.flags
    if not (flags.c_contiguous or flags.f_contiguous) and not array.dtype.hasobject:
        array = sys.modules["numpy"].ascontiguousarray(array)
    return array.__reduce_ex__(5)


# -- the tables ----------------------------------------------------------------------------------
_table: dict[type, Any] = {}
_ours_by_type: dict[type, Callable[[Any], Any]] = {}
_table_state: tuple[Any, ...] | None = None


def dispatch_table() -> dict[type, Any]:
    """copyreg's table with this module's reducers, made again when copyreg's table grows or
    torch or numpy has been imported since (neither is imported here)."""
    global _table, _ours_by_type, _table_state, _strided
    modules = sys.modules
    tensor = getattr(modules.get("torch"), "Tensor", None)
    ndarray = getattr(modules.get("numpy"), "ndarray", None)
    state = (len(copyreg.dispatch_table), tensor, ndarray)
    if state != _table_state:
        ours: dict[type, Callable[[Any], Any]] = {memoryview: _memoryview_reduction}
        if isinstance(tensor, type):
            ours[tensor] = _tensor_reduction
            _strided = modules["torch"].strided
        if isinstance(ndarray, type):
            ours[ndarray] = _ndarray_reduction
        _table = {**copyreg.dispatch_table, **ours}
        _ours_by_type, _table_state = ours, state
    return _table


def by_value_reduction(obj: Any) -> Any:
    """For cloudpickle's ``reducer_override``: this module's reduction of ``obj``, or None."""
    reduce = _ours_by_type.get(type(obj))
    return None if reduce is None else reduce(obj)
