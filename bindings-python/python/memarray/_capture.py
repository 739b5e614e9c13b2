"""Whether this thread is inside a CUDA graph capture begun by torch or CuPy, for paths
that wait on the host and so cannot be captured (MPI's staging of device arrays): they
refuse with ``memarray.CaptureError`` before touching the device, where the driver would
otherwise invalidate the capture. memarray's own calls on a stream being captured are
checked in Rust (the array's stream is asked); this covers work on other streams while
the thread's current torch or CuPy stream is capturing. Only libraries already imported
are asked."""

from __future__ import annotations

import sys

from ._memarray import CaptureError


def capturing_peer() -> str | None:
    """``"torch"`` or ``"cupy"`` when that library's current stream on this thread is
    being captured; None otherwise (or when neither is imported or initialised)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
                return "torch"
        except Exception:  # noqa: BLE001 - a torch without CUDA: not capturing
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            if cupy.cuda.get_current_stream().is_capturing():
                return "cupy"
        except Exception:  # noqa: BLE001 - CuPy without a device: not capturing
            pass
    return None


def refuse_if_capturing(what: str) -> None:
    """Raises ``CaptureError`` naming ``what`` when this thread's current torch or CuPy
    stream is being captured."""
    peer = capturing_peer()
    if peer is not None:
        raise CaptureError(
            f"{what} cannot be captured into a CUDA graph: {peer}'s current stream on this "
            "thread is being captured and this call waits on the host; call it before the "
            "capture begins or after it ends (the capture is still valid)"
        )
