//! Shapes: checked element counts, C-contiguous strides, 64-bit offsets.

use crate::error::{CoreError, Result};

/// The largest ndim memarray supports (NumPy's limit until 2.0, DLPack consumers' common cap).
pub const MAX_NDIM: usize = 32;

/// Number of elements in `shape`, checked: overflow of `u64` is an error, not a wrap.
/// An empty shape (0-d array) has one element.
pub fn checked_len(shape: &[usize]) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| CoreError::ShapeOverflow {
            shape: shape.to_vec(),
        })
}

/// Byte size of an array of `shape` with elements of `elem_size` bytes, checked against
/// `usize` and `isize::MAX` (the largest allocation Rust allows). Every extent must fit
/// `isize` too, even beside a zero extent (where the product is 0): NumPy, DLPack and the
/// buffer protocol hold extents as signed 64-bit integers.
pub fn checked_nbytes(shape: &[usize], elem_size: usize) -> Result<usize> {
    let overflow = || CoreError::ShapeOverflow {
        shape: shape.to_vec(),
    };
    if shape.iter().any(|&d| d > isize::MAX as usize) {
        return Err(overflow());
    }
    let len = checked_len(shape)?;
    let bytes = len.checked_mul(elem_size as u64).ok_or_else(overflow)?;
    if bytes > isize::MAX as u64 {
        return Err(overflow());
    }
    Ok(bytes as usize)
}

/// Validates a shape for storage: ndim within [`MAX_NDIM`], byte size representable.
pub fn validate(shape: &[usize], elem_size: usize) -> Result<usize> {
    if shape.len() > MAX_NDIM {
        return Err(CoreError::TooManyDims {
            ndim: shape.len(),
            max: MAX_NDIM,
        });
    }
    checked_nbytes(shape, elem_size)
}

/// C-contiguous (row-major) strides, in elements. Dimensions of extent 0 or 1 still get
/// the stride a dense layout gives them, so strides are never 0 for a non-empty array.
/// An empty array's extents may multiply past `i64::MAX` (they address nothing): its
/// strides then saturate at `i64::MAX` rather than wrap negative (found by the DLPack
/// import fuzzer).
pub fn c_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(i64::try_from(d.max(1)).unwrap_or(i64::MAX));
    }
    strides
}

/// Whether `strides` (in elements) describe a C-contiguous layout of `shape`. Strides of
/// dimensions with extent 1 are ignored, as NumPy and DLPack consumers do; an empty array
/// is contiguous whatever its strides.
pub fn is_c_contiguous(shape: &[usize], strides: &[i64]) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.wrapping_mul(d as i64);
    }
    true
}

/// Linear (C-order) offset of `index` in `shape`, bounds-checked, in elements.
pub fn offset_of(shape: &[usize], index: &[u64]) -> Result<u64> {
    if index.len() != shape.len() {
        return Err(CoreError::WrongNdim {
            expected: shape.len(),
            got: index.len(),
        });
    }
    let mut off = 0u64;
    for (&i, &d) in index.iter().zip(shape) {
        if i >= d as u64 {
            return Err(CoreError::OutOfBounds {
                index: index.to_vec(),
                shape: shape.to_vec(),
            });
        }
        off = off * d as u64 + i;
    }
    Ok(off)
}

/// The multi-index of C-order linear offset `linear` in `shape`, bounds-checked.
pub fn unravel(shape: &[usize], linear: u64) -> Result<Vec<u64>> {
    if linear >= checked_len(shape)? {
        return Err(CoreError::OutOfBounds {
            index: vec![linear],
            shape: shape.to_vec(),
        });
    }
    let mut out = vec![0u64; shape.len()];
    let mut rest = linear;
    for (o, &d) in out.iter_mut().zip(shape).rev() {
        *o = rest % d as u64;
        rest /= d as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn c_strides_of_empty_overflowing_shapes_never_go_negative() {
        let shape = [0, i64::MAX as usize, 1 << 62, 0, 2];
        let st = super::c_strides(&shape);
        assert!(st.iter().all(|&s| s > 0), "{st:?}");
        assert_eq!(st[4], 1);
        assert_eq!(st[3], 2);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_d_has_one_element_and_empty_has_none() {
        assert_eq!(checked_len(&[]).unwrap(), 1);
        assert_eq!(checked_len(&[3, 0, 5]).unwrap(), 0);
        assert_eq!(c_strides(&[]), Vec::<i64>::new());
        assert_eq!(offset_of(&[], &[]).unwrap(), 0);
        assert_eq!(unravel(&[], 0).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn overflow_is_an_error() {
        let e = checked_len(&[1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(e, CoreError::ShapeOverflow { .. }));
        assert!(checked_nbytes(&[1 << 62], 8).is_err());
        assert!(validate(&[1; 33], 1).is_err());
        assert_eq!(validate(&[1; 32], 1).unwrap(), 1);
    }

    #[test]
    fn over_2_pow_31_elements_index_with_64_bits() {
        let shape = [3usize, 1 << 31];
        let off = offset_of(&shape, &[2, (1 << 31) - 1]).unwrap();
        assert_eq!(off, 3 * (1u64 << 31) - 1);
        assert_eq!(unravel(&shape, off).unwrap(), vec![2, (1 << 31) - 1]);
    }

    #[test]
    fn strides_and_contiguity() {
        assert_eq!(c_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(is_c_contiguous(&[2, 3, 4], &[12, 4, 1]));
        assert!(!is_c_contiguous(&[2, 3, 4], &[1, 2, 6]));
        assert!(is_c_contiguous(&[2, 1, 4], &[4, 99, 1]));
        assert!(is_c_contiguous(&[2, 0, 4], &[7, 7, 7]));
    }

    #[test]
    fn bad_indices_are_refused() {
        assert!(matches!(
            offset_of(&[2, 3], &[2, 0]),
            Err(CoreError::OutOfBounds { .. })
        ));
        assert!(matches!(
            offset_of(&[2, 3], &[1]),
            Err(CoreError::WrongNdim {
                expected: 2,
                got: 1
            })
        ));
        assert!(unravel(&[2, 3], 6).is_err());
    }

    fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
        proptest::collection::vec(1usize..7, 0..6)
    }

    proptest! {
        #[test]
        fn unravel_inverts_offset(shape in shape_strategy(), seed in any::<u64>()) {
            let len = checked_len(&shape).unwrap();
            let linear = seed % len;
            let idx = unravel(&shape, linear).unwrap();
            prop_assert_eq!(offset_of(&shape, &idx).unwrap(), linear);
        }

        #[test]
        fn offset_matches_strides(shape in shape_strategy(), seed in any::<u64>()) {
            let len = checked_len(&shape).unwrap();
            let idx = unravel(&shape, seed % len).unwrap();
            let strides = c_strides(&shape);
            let by_strides: i64 = idx.iter().zip(&strides).map(|(&i, &s)| i as i64 * s).sum();
            prop_assert_eq!(by_strides as u64, offset_of(&shape, &idx).unwrap());
            prop_assert!(is_c_contiguous(&shape, &strides));
        }

        #[test]
        fn checked_len_agrees_with_u128(shape in proptest::collection::vec(0usize..(1 << 20), 0..5)) {
            let exact: u128 = shape.iter().map(|&d| d as u128).product();
            match checked_len(&shape) {
                Ok(n) => prop_assert_eq!(n as u128, exact),
                Err(_) => prop_assert!(exact > u64::MAX as u128),
            }
        }
    }
}
