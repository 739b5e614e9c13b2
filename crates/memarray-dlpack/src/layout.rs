//! The host-mapping check of imports (`msync`). The layout rules themselves are
//! memarray-core's ([`memarray_core::layout`]), shared with the CUDA Array Interface.

/// Whether every page of `[address, address + len)` is mapped in this process (`msync`
/// with `MS_ASYNC` validates the range and does nothing else on Linux since 2.6.19).
/// `len` 0 is trivially mapped.
pub(crate) fn host_range_mapped(address: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let page = 4096u64;
    let start = address - address % page;
    let Some(end) = address.checked_add(len) else {
        return false;
    };
    let (Ok(start_p), Ok(n)) = (usize::try_from(start), usize::try_from(end - start)) else {
        return false;
    };
    // SAFETY: msync only inspects the mappings of [start, start + n); MS_ASYNC schedules
    // no I/O. An unmapped range is ENOMEM, never a fault.
    unsafe { libc::msync(start_p as *mut libc::c_void, n, libc::MS_ASYNC) == 0 }
}
