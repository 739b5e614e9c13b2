//! What the framework files share: the block alignment handed out and the stream
//! argument of C-level callers.

use memarray_core::RawStream;

/// Alignment of blocks handed to torch, CuPy and RMM (torch asks for none; its own
/// allocator gives 512).
pub(super) const TORCH_ALIGN: usize = 256;

/// A stream handle from a C-level caller (torch, CuPy) as a core stream: 0 is the legacy
/// default stream.
pub(super) fn raw_stream(stream: usize) -> RawStream {
    if stream == 0 {
        RawStream::LEGACY
    } else {
        // SAFETY: the caller passes a live stream of the device's primary context,
        // current for the call (RawStream's contract).
        unsafe { RawStream::from_raw(stream) }
    }
}
