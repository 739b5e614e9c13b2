"""``memarray.asarray``: anything array-like as a MemArray, routed by where its data is
and where it is asked for (below the package face, so the engines' glue imports it
downward)."""

from __future__ import annotations

from . import _memarray, cuda, dlpack
from ._memarray import MemArray, _device_pair, _numpy_to_device, empty, from_dlpack


def asarray(obj, dtype=None, copy: bool | None = None, device=None) -> MemArray:
    """Converts ``obj`` to a MemArray.

    A MemArray is returned as is (deep-copied with ``copy=True``). DLPack producers
    (NumPy, torch, CuPy, JAX) and objects with ``__cuda_array_interface__`` (Numba) are
    imported zero-copy where possible; anything else goes through ``numpy.asarray``.
    ``copy`` has ``from_dlpack``'s meaning.

    ``device`` ("cpu", "cuda", "cuda:N", an int, a DLPack pair; ``None`` keeps the data
    where it is) asks for the result there. Host data bound for a device is copied
    straight into a new device-resident array through the staged pinned pipeline (no
    host copy in between); ``copy=False`` with a device other than the data's is a
    ValueError.

    ``dtype`` (anything ``MemArray`` takes, torch dtypes included) casts host data as
    ``numpy.asarray(obj, dtype)`` does (a copy when the dtype differs, so ``copy=False``
    then raises ValueError). Data already of that dtype is taken as it is; device data of
    another dtype is a TypeError (memarray has no arithmetic: cast it in torch or CuPy).
    """
    if dtype is not None:
        obj = _cast(obj, dtype, copy)
    if device is None:
        if isinstance(obj, MemArray):
            return obj.copy() if copy else obj
        if hasattr(obj, "__dlpack__"):
            return from_dlpack(obj, copy=copy)
        if hasattr(obj, "__cuda_array_interface__"):
            return cuda.from_cuda_array_interface(obj, copy=copy)
        import numpy as np

        return from_dlpack(np.asarray(obj), copy=copy)
    if copy is not False:
        # An exact NumPy array for a device: one call (the small-call path).
        fast = _numpy_to_device(obj, device)
        if fast is not None:
            return fast
    target = _device_pair(device)
    if not isinstance(obj, MemArray) and not _on_device(obj):
        if copy is False:
            raise ValueError(f"copy=False, but the data is on the host and device={device!r}")
        import numpy as np

        if isinstance(obj, np.ndarray) or not hasattr(obj, "__dlpack__"):
            host = np.asarray(obj)
        elif target == (dlpack.kDLCPU, 0):
            # memarray's own import: every dtype (NumPy's DLPack import refuses bfloat16),
            # the same result as asarray(obj) and from_dlpack(obj).
            return from_dlpack(obj, copy=copy)
        else:
            try:
                host = np.from_dlpack(obj)
            except (RuntimeError, BufferError, TypeError):
                # A dtype NumPy cannot take (bfloat16): a copy through memarray's import,
                # uploaded (a copy, so the producer's memory is never written).
                a = from_dlpack(obj, copy=True)
                a.move_memory(*target)
                return a
        if target == (dlpack.kDLCPU, 0):
            return from_dlpack(host, copy=copy)
        out = empty(host.shape, host.dtype, device=device)
        out.read_numpy_array(host)
        return out
    a = asarray(obj, copy=copy)
    here = a.__dlpack_device__()
    here = (dlpack.kDLCPU, 0) if here[0] != dlpack.kDLCUDA else here
    if here != target:
        if copy is False:
            raise ValueError(f"copy=False, but the data is on {a.device} and device={device!r}")
        if a is obj:
            a = a.copy()
        a.move_memory(*target)
    return a


def _cast(obj, dtype, copy: bool | None):
    """``obj`` as ``dtype`` for ``asarray``: as it is when its dtype is that already, else a
    NumPy cast of host data."""
    want = empty((0,), dtype)._dtype_name  # memarray's reading of any dtype spelling
    have = None
    if isinstance(obj, MemArray):
        have = obj._dtype_name
    elif hasattr(obj, "dtype"):
        try:
            have = empty((0,), obj.dtype)._dtype_name
        except (TypeError, ValueError):
            have = None
    if have == want:
        return obj
    if copy is False:
        raise ValueError(f"copy=False, but the data is {have} and dtype={want} needs a cast")
    if (isinstance(obj, MemArray) and obj.on_device) or (
        not isinstance(obj, MemArray) and _on_device(obj)
    ):
        raise TypeError(
            f"asarray(x, dtype={want}) of {have} device data: memarray does not compute; "
            f"cast on the device first (t.to(...), cupy.asarray(x).astype(...)), or move "
            f"it to the host"
        )
    import numpy as np

    from .cluster import numpy_dtype

    host = obj.to_numpy() if isinstance(obj, MemArray) else np.asarray(obj)
    return np.asarray(host, dtype=numpy_dtype(want))


def _on_device(obj) -> bool:
    """Whether ``obj`` (not a MemArray) holds its data on a CUDA device."""
    if hasattr(obj, "__dlpack_device__"):
        kind, _ = _memarray._producer_device(obj)  # checked as every import checks it
        return kind in (dlpack.kDLCUDA, dlpack.kDLCUDAManaged)
    return hasattr(obj, "__cuda_array_interface__")
