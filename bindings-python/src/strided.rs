//! Element-wise copy of a strided (non-contiguous) tensor into C order.

use memarray_dlpack::ImportedTensor;

/// Copies every element of `t`, in C order, into `out` (exactly `t.nbytes()` bytes).
///
/// # Safety
/// 1. `t` describes host-readable memory: its data pointer, shape and strides were
///    validated on import and stay valid while `t` lives.
pub unsafe fn gather(t: &ImportedTensor, out: &mut [u8]) {
    debug_assert_eq!(out.len(), t.nbytes());
    let base = t.data().cast::<u8>().cast_const();
    // SAFETY: forwarded from item 1: validated strides keep every element in the tensor.
    unsafe { gather_raw(base, t.shape(), t.strides(), t.dtype().size(), out) }
}

/// Copies the elements of `shape` at `base` with non-negative `strides` (in elements of
/// `size` bytes), in C order, into `out` (the element count times `size` bytes).
///
/// # Safety
/// 1. For every index, `base + sum(idx[d] * strides[d]) * size` is readable for `size`
///    bytes (the caller checked the span).
pub unsafe fn gather_raw(
    base: *const u8,
    shape: &[usize],
    strides: &[i64],
    size: usize,
    out: &mut [u8],
) {
    let strides: Vec<isize> = strides
        .iter()
        .map(|&s| s as isize * size as isize)
        .collect();
    let mut idx = vec![0usize; shape.len()];
    let mut src_off: isize = 0;
    for chunk in out.chunks_exact_mut(size) {
        // SAFETY: src_off is the byte offset of idx under the checked strides (item 1).
        unsafe { std::ptr::copy_nonoverlapping(base.offset(src_off), chunk.as_mut_ptr(), size) };
        for axis in (0..shape.len()).rev() {
            idx[axis] += 1;
            src_off += strides[axis];
            if idx[axis] < shape[axis] {
                break;
            }
            src_off -= strides[axis] * shape[axis] as isize;
            idx[axis] = 0;
        }
    }
}
