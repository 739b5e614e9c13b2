//! Strided layouts: the one check every tensor crossing memarray's boundary passes (a
//! producer's on import, memarray's on export), its span, and the element-wise gather of
//! a non-contiguous layout into C order.
//!
//! A layout is accepted when every index addresses a distinct element at a non-negative
//! offset from `data + byte_offset`, that address is element-aligned, and the last byte
//! reachable stays below [`ADDRESS_LIMIT`]. Non-contiguous layouts pass; [`gather`] reads
//! them.

use crate::error::{CoreError, LayoutError};
use crate::{DType, MAX_NDIM, shape};

/// The first address no process maps (the end of user space on every 64-bit platform
/// memarray runs on, with room for 5-level paging).
pub const ADDRESS_LIMIT: u64 = 1 << 57;

/// Checks ndim and the element count / byte size of `shape`; extents must fit in `i64`.
pub fn check_shape(shape: &[usize], dtype: DType) -> Result<(), CoreError> {
    if shape.len() > MAX_NDIM {
        return Err(CoreError::TooManyDims {
            ndim: shape.len(),
            max: MAX_NDIM,
        });
    }
    // `checked_nbytes` misses huge extents next to a zero extent (the product is 0), and
    // DLPack extents are `int64_t`.
    if shape.iter().any(|&d| i64::try_from(d).is_err()) {
        return Err(CoreError::ShapeOverflow {
            shape: shape.to_vec(),
        });
    }
    shape::checked_nbytes(shape, dtype.size())?;
    Ok(())
}

/// Checks strides, data pointer and alignment for a shape that passed [`check_shape`]:
/// every index addresses a distinct element at a non-negative offset from
/// `data + byte_offset`, that address is element-aligned, and the last byte reachable
/// stays below [`ADDRESS_LIMIT`]. `strides` has one entry per dimension, in elements.
/// Strides of extent-1 dimensions are ignored (as NumPy does); an empty tensor passes
/// with any strides and pointer.
pub fn check(
    shape: &[usize],
    strides: &[i64],
    dtype: DType,
    data: u64,
    byte_offset: u64,
) -> Result<(), LayoutError> {
    if strides.len() != shape.len() {
        return Err(LayoutError::StridesLength {
            ndim: shape.len(),
            strides: strides.len(),
        });
    }
    // An empty tensor addresses no memory: any strides, pointer and offset are harmless.
    if shape.contains(&0) {
        return Ok(());
    }
    let span_overflow = || LayoutError::SpanOverflow {
        strides: strides.to_vec(),
        shape: shape.to_vec(),
        itemsize: dtype.size(),
        address: data.checked_add(byte_offset).unwrap_or(data),
    };

    // Strides of extent-1 dimensions are never used to address memory; producers (PyTorch)
    // put arbitrary values there, so they are ignored, as NumPy does.
    // On the stack: this runs on every export, which should stay well under a microsecond.
    let mut used = [(0u128, 0u128); MAX_NDIM];
    let mut n_used = 0;
    for (dim, (&extent, &stride)) in shape.iter().zip(strides).enumerate() {
        if extent <= 1 {
            continue;
        }
        if stride < 0 {
            return Err(LayoutError::NegativeStride {
                dim,
                stride,
                strides: strides.to_vec(),
                shape: shape.to_vec(),
            });
        }
        used[n_used] = (stride as u128, extent as u128);
        n_used += 1;
    }
    let used = &mut used[..n_used];

    // Sufficient test for distinct addresses: ordered by stride, each stride must step past
    // everything the smaller strides reach. It also refuses stride 0 (broadcast). A few exotic
    // interleaved layouts that do not alias are refused too; they are copied instead.
    used.sort_unstable();
    let mut reach: u128 = 0; // largest element offset reachable so far
    for &(stride, extent) in used.iter() {
        if stride <= reach {
            return Err(LayoutError::OverlappingStrides {
                strides: strides.to_vec(),
                shape: shape.to_vec(),
            });
        }
        // At most 32 terms of (2^63 * 2^63): fits in u128 until checked below.
        reach += stride * (extent - 1);
        if reach > u64::MAX as u128 {
            return Err(span_overflow());
        }
    }

    let span_bytes = (reach + 1) * dtype.size() as u128;
    if span_bytes > isize::MAX as u128 {
        return Err(span_overflow());
    }
    if data == 0 {
        return Err(LayoutError::NullData {
            shape: shape.to_vec(),
        });
    }
    let address = data.checked_add(byte_offset).ok_or_else(span_overflow)?;
    if (address as u128) + span_bytes > u64::MAX as u128 + 1 {
        return Err(span_overflow());
    }
    // No process maps memory at or above 2^57 (x86-64 with 5-level paging ends user space
    // at 2^56, AArch64 at 2^52): a tensor reaching there is a forged or corrupt pointer,
    // byte_offset or stride.
    if (address as u128) + span_bytes > ADDRESS_LIMIT as u128 {
        return Err(LayoutError::OutsideAddressSpace {
            address,
            span: span_bytes as u64,
            limit: ADDRESS_LIMIT,
        });
    }
    if address % dtype.align() as u64 != 0 {
        return Err(LayoutError::Misaligned {
            data,
            byte_offset,
            address,
            dtype,
            align: dtype.align(),
        });
    }
    Ok(())
}

/// Bytes from the first element to the end of the last one (0 for an empty tensor).
/// Only meaningful for a layout that passed [`check`].
pub fn span_bytes(shape: &[usize], strides: &[i64], itemsize: usize) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    let last: usize = shape
        .iter()
        .zip(strides)
        .filter(|&(&d, _)| d > 1)
        .map(|(&d, &s)| (d - 1) * s as usize)
        .sum();
    (last + 1) * itemsize
}

/// Copies the elements of `shape` at `base` with non-negative `strides` (in elements of
/// `size` bytes), in C order, into `out` (the element count times `size` bytes).
///
/// # Safety
/// 1. For every index, `base + sum(idx[d] * strides[d]) * size` is readable for `size`
///    bytes (a layout that passed [`check`], over memory of its [`span_bytes`]).
pub unsafe fn gather(
    base: *const u8,
    shape: &[usize],
    strides: &[i64],
    size: usize,
    out: &mut [u8],
) {
    debug_assert_eq!(out.len(), shape.iter().product::<usize>() * size);
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

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: u64 = 0x1000;

    fn ok(shape: &[usize], strides: &[i64]) -> Result<(), LayoutError> {
        check(shape, strides, DType::F32, ADDR, 0)
    }

    #[test]
    fn contiguous_and_strided_views_pass() {
        ok(&[2, 3, 4], &[12, 4, 1]).unwrap();
        ok(&[2, 3], &[1, 2]).unwrap(); // Fortran order
        ok(&[2, 3], &[6, 2]).unwrap(); // every other column
        ok(&[4, 1, 3], &[3, -7, 1]).unwrap(); // extent-1 stride ignored
        ok(&[], &[]).unwrap();
        assert_eq!(span_bytes(&[2, 3], &[6, 2], 4), (6 + 4 + 1) * 4);
        assert_eq!(span_bytes(&[], &[], 8), 8);
    }

    #[test]
    fn negative_and_aliasing_strides_are_refused() {
        assert!(matches!(
            ok(&[3, 2], &[-2, 1]),
            Err(LayoutError::NegativeStride {
                dim: 0,
                stride: -2,
                ..
            })
        ));
        assert!(matches!(
            ok(&[3, 2], &[0, 1]),
            Err(LayoutError::OverlappingStrides { .. })
        ));
        assert!(matches!(
            ok(&[3, 3], &[1, 2]),
            Err(LayoutError::OverlappingStrides { .. })
        ));
        assert!(matches!(
            ok(&[2, 2], &[1, 1]),
            Err(LayoutError::OverlappingStrides { .. })
        ));
    }

    #[test]
    fn empty_tensors_skip_layout_checks() {
        check(&[0, 3], &[-1, 0], DType::F64, 0, 3).unwrap();
    }

    #[test]
    fn null_misaligned_and_overflowing_data_are_refused() {
        assert!(matches!(
            check(&[2], &[1], DType::F32, 0, 0),
            Err(LayoutError::NullData { .. })
        ));
        let e = check(&[2], &[1], DType::F32, ADDR, 2).unwrap_err();
        assert!(matches!(e, LayoutError::Misaligned { align: 4, .. }), "{e}");
        assert!(e.to_string().contains("byte_offset 2"), "{e}");
        check(&[2], &[1], DType::Complex64, ADDR, 4).unwrap();
        assert!(matches!(
            check(&[2, 2], &[1 << 62, 1], DType::F64, ADDR, 0),
            Err(LayoutError::SpanOverflow { .. })
        ));
        assert!(matches!(
            check(&[2], &[1], DType::F32, u64::MAX - 3, 0),
            Err(LayoutError::SpanOverflow { .. })
        ));
    }

    #[test]
    fn shapes_are_checked() {
        check_shape(&[1; 32], DType::U8).unwrap();
        assert!(matches!(
            check_shape(&[1; 33], DType::U8),
            Err(CoreError::TooManyDims { ndim: 33, .. })
        ));
        assert!(matches!(
            check_shape(&[0, usize::MAX], DType::U8),
            Err(CoreError::ShapeOverflow { .. })
        ));
        assert!(matches!(
            check_shape(&[1 << 40, 1 << 40], DType::U8),
            Err(CoreError::ShapeOverflow { .. })
        ));
    }

    #[test]
    fn gather_reads_a_strided_view_in_c_order() {
        // Every other column of a 3x4 row-major u16 matrix.
        let data: Vec<u16> = (0..12).collect();
        let mut out = vec![0u8; 6 * 2];
        check(&[3, 2], &[4, 2], DType::U16, data.as_ptr() as u64, 0).unwrap();
        // SAFETY: the layout passed `check` over `data`'s 12 elements.
        unsafe { gather(data.as_ptr().cast(), &[3, 2], &[4, 2], 2, &mut out) };
        let got: Vec<u16> = out
            .chunks(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 2, 4, 6, 8, 10]);
        // Fortran order comes back transposed into C order.
        let mut out = vec![0u8; 6 * 2];
        // SAFETY: as above (span 6 elements).
        unsafe { gather(data.as_ptr().cast(), &[2, 3], &[1, 2], 2, &mut out) };
        let got: Vec<u16> = out
            .chunks(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 2, 4, 1, 3, 5]);
    }
}
