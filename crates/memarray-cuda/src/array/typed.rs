//! [`MemArray<T, N>`]: the typed face of [`RawArray`].

use std::marker::PhantomData;

use ndarray::{ArrayView, ArrayViewMut, Dim, Dimension, IntoDimension};

use memarray_core::{DType, Element, Indexer, Location, LockToken};

use super::host_kind::HostKind;
use super::raw::RawArray;
use crate::error::Result;
use crate::stream::StreamRef;

/// A typed N-d array mirrored between host and device (the seed's `MemArray<T, ndim>`).
///
/// Checked accessors take an optional [`LockToken`]; while the array is locked, only the
/// holder's token passes. Moves are Rust moves; [`Clone`] is deep.
///
/// # Example
///
/// ```
/// use memarray_core::Location;
/// use memarray_cuda::MemArray;
///
/// let mut a = MemArray::<f32, 3>::new([2, 4, 7])?; // zeroed
/// a.set([1, 3, 6], 15.0)?;
/// assert_eq!(a.get([1, 3, 6])?, 15.0);
/// if memarray_cuda::is_available() {
///     a.move_memory(Location::Device(0), None, true, None)?;
///     assert_eq!(a.get([1, 3, 6])?, 15.0); // read back from the device
/// }
/// let view = a.view(); // an ndarray view of the host copy, or an error on the device
/// assert_eq!(view.is_ok(), a.location() == Location::Host);
/// # Ok::<(), memarray_cuda::CudaError>(())
/// ```
#[derive(Debug)]
pub struct MemArray<T: Element, const N: usize> {
    raw: RawArray,
    _t: PhantomData<T>,
}

impl<T: Element, const N: usize> MemArray<T, N> {
    /// A zero-filled array of `shape` on the host, targeting device 0, with the default
    /// host memory kind ([`HostKind::auto`]).
    pub fn new(shape: [usize; N]) -> Result<Self> {
        Ok(Self::wrap(RawArray::zeros(T::DTYPE, &shape, 0)?))
    }

    /// A zero-filled array with the given default device and host memory kind.
    pub fn with_options(shape: [usize; N], device_id: u32, host_kind: HostKind) -> Result<Self> {
        Ok(Self::wrap(RawArray::zeros_in(
            T::DTYPE,
            &shape,
            device_id,
            host_kind,
        )?))
    }

    /// An array holding a copy of `data` (C order), whose length must match `shape`.
    pub fn from_slice(shape: [usize; N], data: &[T]) -> Result<Self> {
        // SAFETY: Element types are plain data without padding (Element's contract).
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        Ok(Self::wrap(RawArray::from_bytes(
            T::DTYPE,
            &shape,
            bytes,
            0,
        )?))
    }

    /// An array holding a copy of an ndarray view of any layout.
    pub fn from_ndarray<S>(a: &ndarray::ArrayBase<S, Dim<[usize; N]>>) -> Result<Self>
    where
        S: ndarray::Data<Elem = T>,
        Dim<[usize; N]>: Dimension,
    {
        let shape: [usize; N] = a.shape().try_into().expect("Dim<[usize; N]> has N dims");
        let data: Vec<T> = a.iter().copied().collect();
        Self::from_slice(shape, &data)
    }

    fn wrap(raw: RawArray) -> Self {
        Self {
            raw,
            _t: PhantomData,
        }
    }

    /// The type-erased array beneath.
    pub fn as_raw(&self) -> &RawArray {
        &self.raw
    }
    /// The type-erased array beneath, mutably.
    pub fn as_raw_mut(&mut self) -> &mut RawArray {
        &mut self.raw
    }
    /// Unwraps into the type-erased array.
    pub fn into_raw(self) -> RawArray {
        self.raw
    }
    /// Wraps a type-erased array whose dtype and ndim match `T` and `N`.
    pub fn try_from_raw(raw: RawArray) -> Result<Self> {
        if raw.dtype() != T::DTYPE {
            return Err(memarray_core::CoreError::DTypeMismatch {
                held: raw.dtype(),
                requested: T::DTYPE,
            }
            .into());
        }
        if raw.ndim() != N {
            return Err(memarray_core::CoreError::WrongNdim {
                expected: N,
                got: raw.ndim(),
            }
            .into());
        }
        Ok(Self::wrap(raw))
    }

    /// Extent of each dimension.
    pub fn shape(&self) -> [usize; N] {
        self.raw
            .shape()
            .try_into()
            .expect("ndim checked at construction")
    }
    /// Number of elements.
    pub fn size(&self) -> u64 {
        self.raw.len()
    }
    /// Number of dimensions (`N`).
    pub const fn ndim(&self) -> usize {
        N
    }
    /// [`RawArray::try_lock`], panicking if already locked.
    ///
    /// # Panics
    /// If the array is locked; use [`RawArray::try_lock`] (through `Deref`) to get the
    /// error instead.
    pub fn lock(&self) -> LockToken {
        self.try_lock().expect("MemArray::lock on a locked array")
    }

    /// Moves the current data to `target`; see [`RawArray::move_memory`].
    pub fn move_memory(
        &mut self,
        target: Location,
        stream: Option<StreamRef>,
        sync: bool,
        token: Option<LockToken>,
    ) -> Result<()> {
        self.raw.move_memory(target, stream, sync, token)
    }

    /// Reads one element, checking bounds and the lock (the seed's `operator()`).
    pub fn get(&self, index: [usize; N]) -> Result<T> {
        self.get_with(index, None)
    }

    /// [`MemArray::get`] presenting a lock token.
    pub fn get_with(&self, index: [usize; N], token: Option<LockToken>) -> Result<T> {
        #[repr(C, align(16))]
        struct Slot([u8; 16]);
        let mut slot = Slot([0; 16]);
        let bytes = &mut slot.0[..std::mem::size_of::<T>()];
        self.raw
            .read_element(&index.map(|i| i as u64), bytes, token)?;
        // SAFETY: slot is 16-aligned (enough for every Element) and holds the element's
        // bytes; load tolerates any bit pattern.
        Ok(unsafe { T::load(slot.0.as_ptr().cast()) })
    }

    /// Writes one element, checking bounds and the lock (the seed's `write`).
    pub fn set(&mut self, index: [usize; N], value: T) -> Result<()> {
        self.set_with(index, value, None)
    }

    /// [`MemArray::set`] presenting a lock token.
    pub fn set_with(
        &mut self,
        index: [usize; N],
        value: T,
        token: Option<LockToken>,
    ) -> Result<()> {
        // SAFETY: value is plain data of size_of::<T>() bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const value).cast::<u8>(), std::mem::size_of::<T>())
        };
        self.raw
            .write_element(&index.map(|i| i as u64), bytes, token)
    }

    /// An ndarray view of the host copy (the data must be on the host).
    pub fn view(&self) -> Result<ArrayView<'_, T, Dim<[usize; N]>>>
    where
        [usize; N]: IntoDimension<Dim = Dim<[usize; N]>>,
        Dim<[usize; N]>: Dimension,
    {
        self.view_with(None)
    }

    /// [`MemArray::view`] presenting a lock token.
    pub fn view_with(&self, token: Option<LockToken>) -> Result<ArrayView<'_, T, Dim<[usize; N]>>>
    where
        [usize; N]: IntoDimension<Dim = Dim<[usize; N]>>,
        Dim<[usize; N]>: Dimension,
    {
        let p = self.host_elements(token)?;
        // SAFETY: p points to nbytes initialised, aligned bytes holding shape's elements in
        // C order (bools normalised to 0/1), borrowed for the life of &self.
        Ok(unsafe { ArrayView::from_shape_ptr(self.shape(), p.cast::<T>().cast_const()) })
    }

    /// A mutable ndarray view of the host copy (the data must be on the host).
    pub fn view_mut(&mut self) -> Result<ArrayViewMut<'_, T, Dim<[usize; N]>>>
    where
        [usize; N]: IntoDimension<Dim = Dim<[usize; N]>>,
        Dim<[usize; N]>: Dimension,
    {
        self.view_mut_with(None)
    }

    /// [`MemArray::view_mut`] presenting a lock token.
    pub fn view_mut_with(
        &mut self,
        token: Option<LockToken>,
    ) -> Result<ArrayViewMut<'_, T, Dim<[usize; N]>>>
    where
        [usize; N]: IntoDimension<Dim = Dim<[usize; N]>>,
        Dim<[usize; N]>: Dimension,
    {
        let p = self.host_elements(token)?;
        // SAFETY: as in `view`, with &mut self giving exclusive Rust access.
        Ok(unsafe { ArrayViewMut::from_shape_ptr(self.shape(), p.cast::<T>()) })
    }

    /// The host data as a slice (C order; the data must be on the host).
    pub fn as_slice(&self) -> Result<&[T]> {
        let p = self.host_elements(None)?;
        // SAFETY: the host buffer is aligned for T (checked at construction) and holds
        // size() valid elements of T (bools normalised to 0/1).
        Ok(unsafe { std::slice::from_raw_parts(p.cast_const(), self.size() as usize) })
    }

    /// The host address as `*mut T` after the lock check and pending work, with bool bytes
    /// that a foreign producer may have set to values other than 0 and 1 normalised, so a
    /// `&[bool]` over them is valid.
    fn host_elements(&self, token: Option<LockToken>) -> Result<*mut T> {
        let p = self.raw.host_ptr(token)?;
        if T::DTYPE == DType::Bool {
            for i in 0..self.nbytes() {
                // SAFETY: i < nbytes of the live host buffer. Only bytes above 1 are
                // written, and no valid &bool can exist over such a byte.
                unsafe {
                    let b = p.add(i);
                    if *b > 1 {
                        *b = 1;
                    }
                }
            }
        }
        Ok(p.cast())
    }

    /// An [`Indexer`] over the current data: the host copy, or the device copy when the
    /// data is on a device (its pointer is then a device address).
    pub fn indexer(&self, token: Option<LockToken>) -> Result<Indexer<N>> {
        self.raw.check(token)?;
        let data = match self.location() {
            Location::Host => self.raw.host_ptr(token)?,
            Location::Device(_) => {
                self.raw.not_spilled()?;
                self.raw.device_side().device_addr()? as *mut u8
            }
        };
        Ok(Indexer::new(data.cast(), self.shape().map(|d| d as u64)))
    }

    /// A checked raw pointer to the host copy (lock checked, pending work awaited).
    pub fn host_ptr(&self, token: Option<LockToken>) -> Result<*mut T> {
        Ok(self.raw.host_ptr(token)?.cast())
    }

    /// The host pointer with no lock, location or pending-work check: the sharp knife.
    ///
    /// # Safety
    /// 1. The caller orders every access after pending device work on this array and
    ///    respects any lock held by an outside observer.
    /// 2. Accesses stay within `nbytes()` and the pointer is not used after the array or
    ///    its host buffer is dropped.
    pub unsafe fn host_ptr_unchecked(&self) -> *mut T {
        self.raw.host_ptr_unchecked().cast()
    }

    /// Swaps contents with `other` without copying; both must be unlocked.
    pub fn swap(&mut self, other: &mut Self) -> Result<()> {
        self.raw.swap(&mut other.raw)
    }

    /// A deep copy (refused while locked; see [`MemArray::try_clone_with`]).
    pub fn try_clone(&self) -> Result<Self> {
        self.try_clone_with(None)
    }

    /// A deep copy, presenting a lock token.
    pub fn try_clone_with(&self, token: Option<LockToken>) -> Result<Self> {
        Ok(Self::wrap(self.raw.try_clone(token)?))
    }
}

/// The untyped array's reads (`nbytes`, `dtype`, `location`, `device_id`, locks,
/// `has_pending_work`, `synchronize`, `read_all`, `host_bytes`, ...) without a forwarding
/// method each. Only shared access: changes that could break `T` and `N` (a swap with an
/// array of another dtype) stay typed methods of `MemArray`.
impl<T: Element, const N: usize> std::ops::Deref for MemArray<T, N> {
    type Target = RawArray;

    fn deref(&self) -> &RawArray {
        &self.raw
    }
}

/// The untyped array underneath, for functions over any array (memarray-seed's, say).
impl<T: Element, const N: usize> AsMut<RawArray> for MemArray<T, N> {
    fn as_mut(&mut self) -> &mut RawArray {
        &mut self.raw
    }
}

impl<T: Element, const N: usize> Clone for MemArray<T, N> {
    /// Deep copy.
    ///
    /// # Panics
    /// If the array is locked or allocation fails; use [`MemArray::try_clone`] (or
    /// [`MemArray::try_clone_with`] with the lock token) to get the error instead.
    fn clone(&self) -> Self {
        self.try_clone()
            .expect("MemArray::clone: allocation failed")
    }
}
