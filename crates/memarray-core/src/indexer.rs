//! [`Indexer`]: a data pointer and a shape, passed by value to kernels.
//!
//! `kernels-cuda/include/memarray/indexer.cuh` mirrors this struct field for field
//! (`void* data; uint64_t shape[N];`); `tests/indexer_layout.rs` compiles a C++ program
//! against that header and checks size and field offsets agree.

use std::ffi::c_void;

use crate::error::{CoreError, Result};

/// A lightweight, copyable view description: where the data starts and its C-order shape.
///
/// It holds no lifetime: it is the seed's `ArrayIndexer`, meant to be copied into kernel
/// arguments. Dereferencing `data` is the caller's business (and needs `unsafe`).
///
/// # Example
///
/// ```
/// use memarray_core::Indexer;
///
/// let ix = Indexer::<3>::new(std::ptr::null_mut(), [2, 4, 7]);
/// assert_eq!(ix.len(), 56);
/// assert_eq!(ix.offset([1, 3, 6]), 1 * 28 + 3 * 7 + 6);
/// assert_eq!(ix.unravel(55), [1, 3, 6]);
/// assert!(ix.try_offset([2, 0, 0]).is_err(), "out of bounds is an error");
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexer<const N: usize> {
    /// First element, on the host or on a device.
    pub data: *mut c_void,
    /// Extent of each dimension.
    pub shape: [u64; N],
}

// SAFETY: an Indexer is an address and integers; it grants no access by itself.
unsafe impl<const N: usize> Send for Indexer<N> {}
// SAFETY: as above; all methods take &self and read plain integers.
unsafe impl<const N: usize> Sync for Indexer<N> {}

impl<const N: usize> Indexer<N> {
    /// An indexer over `data` with `shape`.
    pub const fn new(data: *mut c_void, shape: [u64; N]) -> Self {
        Self { data, shape }
    }

    /// Number of elements (1 for N = 0). Wraps like the kernel's product on overflow;
    /// shapes built by memarray are checked when the array is made.
    pub fn len(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.wrapping_mul(d))
    }

    /// Whether the indexer covers no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// C-order linear offset of `idx`, in elements. Unchecked in release builds, like the
    /// kernel; use [`Indexer::try_offset`] for a bounds-checked form.
    pub fn offset(&self, idx: [u64; N]) -> u64 {
        debug_assert!(idx.iter().zip(&self.shape).all(|(i, d)| i < d));
        idx.iter()
            .zip(&self.shape)
            .fold(0u64, |acc, (&i, &d)| acc.wrapping_mul(d).wrapping_add(i))
    }

    /// [`Indexer::offset`], bounds-checked.
    pub fn try_offset(&self, idx: [u64; N]) -> Result<u64> {
        if idx.iter().zip(&self.shape).any(|(i, d)| i >= d) {
            return Err(CoreError::OutOfBounds {
                index: idx.to_vec(),
                shape: self.shape.iter().map(|&d| d as usize).collect(),
            });
        }
        Ok(self.offset(idx))
    }

    /// The multi-index of C-order offset `linear` (must be `< len()`).
    pub fn unravel(&self, mut linear: u64) -> [u64; N] {
        debug_assert!(linear < self.len());
        let mut out = [0u64; N];
        for (o, &d) in out.iter_mut().zip(&self.shape).rev() {
            *o = linear % d;
            linear /= d;
        }
        out
    }
}

impl<const N: usize> Indexer<N> {
    /// The struct's bytes as a kernel receives it by value (`void* data; uint64_t
    /// shape[N];`, native byte order): what a launch passes for an array argument.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(std::mem::size_of::<Self>());
        out.extend_from_slice(&(self.data as usize as u64).to_ne_bytes());
        for d in self.shape {
            out.extend_from_slice(&d.to_ne_bytes());
        }
        debug_assert_eq!(out.len(), std::mem::size_of::<Self>());
        out
    }
}

/// The bytes of the [`Indexer`] of `shape.len()` dimensions (0 to [`crate::MAX_NDIM`])
/// over `data`: a launch's argument for an array whose ndim is known only at run time.
/// More dimensions are [`CoreError::TooManyDims`].
pub fn indexer_bytes(data: *mut c_void, shape: &[usize]) -> Result<Vec<u8>> {
    fn make<const N: usize>(data: *mut c_void, shape: &[usize]) -> Vec<u8> {
        let mut s = [0u64; N];
        for (o, &d) in s.iter_mut().zip(shape) {
            *o = d as u64;
        }
        Indexer::<N>::new(data, s).to_bytes()
    }
    macro_rules! by_ndim {
        ($($n:literal)*) => {
            match shape.len() {
                $($n => Ok(make::<$n>(data, shape)),)*
                n => Err(CoreError::TooManyDims {
                    ndim: n,
                    max: crate::MAX_NDIM,
                }),
            }
        };
    }
    by_ndim!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_pointer_then_shape() {
        assert_eq!(std::mem::size_of::<Indexer<0>>(), 8);
        assert_eq!(std::mem::size_of::<Indexer<3>>(), 32);
        assert_eq!(std::mem::offset_of!(Indexer<3>, shape), 8);
    }

    #[test]
    fn offsets_of_a_3d_indexer() {
        let ix = Indexer::new(std::ptr::null_mut(), [2, 4, 7]);
        assert_eq!(ix.len(), 56);
        assert_eq!(ix.offset([1, 2, 3]), 28 + 14 + 3);
        assert_eq!(ix.unravel(45), [1, 2, 3]);
        assert!(ix.try_offset([2, 0, 0]).is_err());
        let zero_d = Indexer::new(std::ptr::null_mut(), []);
        assert_eq!(zero_d.len(), 1);
        assert_eq!(zero_d.offset([]), 0);
    }

    proptest! {
        #[test]
        fn unravel_round_trips(a in 1u64..50, b in 1u64..50, c in 1u64..50, seed in any::<u64>()) {
            let ix = Indexer::new(std::ptr::null_mut(), [a, b, c]);
            let linear = seed % ix.len();
            let idx = ix.unravel(linear);
            prop_assert_eq!(ix.offset(idx), linear);
            prop_assert_eq!(ix.try_offset(idx).unwrap(), linear);
            prop_assert_eq!(
                crate::shape::offset_of(&[a as usize, b as usize, c as usize], &idx).unwrap(),
                linear
            );
        }
    }

    #[test]
    fn runtime_ndim_bytes_are_the_structs() {
        let data = 0x1234_5678_9abc_def0usize as *mut c_void;
        let three = indexer_bytes(data, &[2, 4, 7]).unwrap();
        assert_eq!(three, Indexer::<3>::new(data, [2, 4, 7]).to_bytes());
        assert_eq!(three.len(), 32);
        assert_eq!(&three[..8], &(data as usize as u64).to_ne_bytes());
        assert_eq!(&three[24..], &7u64.to_ne_bytes());
        assert_eq!(indexer_bytes(data, &[]).unwrap().len(), 8);
        assert_eq!(indexer_bytes(data, &[1; 32]).unwrap().len(), 8 + 8 * 32);
        assert!(matches!(
            indexer_bytes(data, &[1; 33]),
            Err(CoreError::TooManyDims { ndim: 33, .. })
        ));
    }
}
