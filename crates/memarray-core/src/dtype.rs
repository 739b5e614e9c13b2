//! Element types: the compile-time [`Element`] trait and the runtime [`DType`].

use std::fmt;

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};

/// DLPack `DLDataTypeCode` values (dlpack.h 1.x). Kept here so core needs no FFI crate.
pub mod dl_code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer.
    pub const UINT: u8 = 1;
    /// IEEE float.
    pub const FLOAT: u8 = 2;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Complex (two floats).
    pub const COMPLEX: u8 = 5;
    /// Boolean (one byte each).
    pub const BOOL: u8 = 6;
}

/// Every element type memarray stores: the numeric types DLPack and NumPy share.
///
/// Deliberately exhaustive: [`with_dtype!`](crate::with_dtype) and every dispatch must be
/// revisited when a dtype is added.
///
/// # Example
///
/// ```
/// use memarray_core::DType;
///
/// let d = DType::from_name("float32")?;
/// assert_eq!((d.size(), d.align(), d.dlpack()), (4, 4, (2, 32, 1)));
/// assert_eq!(DType::from_dlpack(2, 32, 1)?, DType::F32);
/// assert_eq!(DType::ALL[d.index()], d);
/// assert!(DType::from_name("float128").is_err(), "unsupported dtypes are an error");
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `bool`, one byte, 0 or 1.
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Two `f32`: real, imaginary.
    Complex64,
    /// Two `f64`: real, imaginary.
    Complex128,
}

impl DType {
    /// All supported dtypes, in a stable order.
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Complex64,
        DType::Complex128,
    ];

    /// Position of this dtype in [`DType::ALL`] (a table index for per-dtype data).
    pub const fn index(self) -> usize {
        // The enum's declaration order is ALL's order; the test `index_matches_all`
        // keeps the two in step.
        self as usize
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::Complex64 => 8,
            DType::Complex128 => 16,
        }
    }

    /// Required alignment of one element in bytes.
    pub const fn align(self) -> usize {
        match self {
            DType::Complex64 => 4,
            DType::Complex128 => 8,
            other => other.size(),
        }
    }

    /// The DLPack `(code, bits, lanes)` triple.
    pub const fn dlpack(self) -> (u8, u8, u16) {
        let code = match self {
            DType::Bool => dl_code::BOOL,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => dl_code::INT,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => dl_code::UINT,
            DType::F16 | DType::F32 | DType::F64 => dl_code::FLOAT,
            DType::BF16 => dl_code::BFLOAT,
            DType::Complex64 | DType::Complex128 => dl_code::COMPLEX,
        };
        (code, (self.size() * 8) as u8, 1)
    }

    /// NumPy array-interface typestr (`"<f8"`, `"|b1"`, ...). bfloat16 has no NumPy
    /// typestr; it is described as two raw bytes, `"<V2"`, as CuPy and Numba accept.
    pub const fn typestr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::BF16 => "<V2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::Complex64 => "<c8",
            DType::Complex128 => "<c16",
        }
    }

    /// Short lowercase name, as NumPy spells it (`"float32"`, `"bfloat16"`, `"complex64"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
        }
    }

    /// Comma-separated list of every supported dtype name, for error messages.
    pub fn supported_names() -> String {
        DType::ALL.map(DType::name).join(", ")
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `$body` with `$T` bound to the Rust element type of runtime dtype `$dtype`.
///
/// The one place a runtime dtype becomes a static type: type-erased code dispatches once
/// through it instead of listing dtype combinations by hand.
///
/// ```
/// use memarray_core::{with_dtype, DType, Element};
/// let size = with_dtype!(DType::F16, T => std::mem::size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::DType as __D;
        match $dtype {
            __D::Bool => {
                type $T = bool;
                $body
            }
            __D::I8 => {
                type $T = i8;
                $body
            }
            __D::I16 => {
                type $T = i16;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            __D::U8 => {
                type $T = u8;
                $body
            }
            __D::U16 => {
                type $T = u16;
                $body
            }
            __D::U32 => {
                type $T = u32;
                $body
            }
            __D::U64 => {
                type $T = u64;
                $body
            }
            __D::F16 => {
                type $T = $crate::f16;
                $body
            }
            __D::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
            __D::Complex64 => {
                type $T = $crate::Complex32;
                $body
            }
            __D::Complex128 => {
                type $T = $crate::Complex64;
                $body
            }
        }
    }};
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type memarray stores. Implemented for exactly the types of [`DType`]; sealed.
///
/// # Safety
/// Implementors are plain data of `DTYPE.size()` bytes with no padding, and every bit
/// pattern that [`Element::load`] can read yields a valid value.
pub unsafe trait Element:
    sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static
{
    /// The runtime dtype of this type.
    const DTYPE: DType;

    /// Reads one element from memory another party may have written.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads of `size_of::<Self>()` bytes and aligned for `Self`.
    unsafe fn load(ptr: *const Self) -> Self {
        // SAFETY: caller guarantees validity and alignment (item 1); for every type except
        // bool all bit patterns are valid values.
        unsafe { ptr.read() }
    }

    /// The element as `f64`, for host reference computations (complex: the real part).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $d:ident, |$x:ident| $to:expr) => {
        impl sealed::Sealed for $t {}
        // SAFETY: $t is plain data without padding whose every bit pattern is valid.
        unsafe impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
        }
    };
}

element!(i8, I8, |x| x as f64);
element!(i16, I16, |x| x as f64);
element!(i32, I32, |x| x as f64);
element!(i64, I64, |x| x as f64);
element!(u8, U8, |x| x as f64);
element!(u16, U16, |x| x as f64);
element!(u32, U32, |x| x as f64);
element!(u64, U64, |x| x as f64);
element!(f16, F16, |x| x.to_f64());
element!(bf16, BF16, |x| x.to_f64());
element!(f32, F32, |x| x as f64);
element!(f64, F64, |x| x);
element!(Complex32, Complex64, |x| x.re as f64);
element!(Complex64, Complex128, |x| x.re);

impl sealed::Sealed for bool {}
// SAFETY: bool is one byte; `load` reads the byte and maps nonzero to true, so bytes other
// than 0 and 1 written by a foreign producer never become an invalid bool.
unsafe impl Element for bool {
    const DTYPE: DType = DType::Bool;
    unsafe fn load(ptr: *const Self) -> Self {
        // SAFETY: caller guarantees `ptr` is valid for one byte (item 1).
        unsafe { ptr.cast::<u8>().read() != 0 }
    }
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn index_matches_all() {
        for (i, d) in super::DType::ALL.iter().enumerate() {
            assert_eq!(d.index(), i, "{d}");
        }
    }

    use super::*;

    fn check<T: Element>() {
        assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{}", T::DTYPE);
        assert_eq!(std::mem::align_of::<T>(), T::DTYPE.align(), "{}", T::DTYPE);
    }

    #[test]
    fn sizes_match_rust_types() {
        check::<bool>();
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f16>();
        check::<bf16>();
        check::<f32>();
        check::<f64>();
        check::<Complex32>();
        check::<Complex64>();
    }

    #[test]
    fn dlpack_round_trip_for_every_dtype() {
        for d in DType::ALL {
            let (c, b, l) = d.dlpack();
            assert_eq!(DType::from_dlpack(c, b, l).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        assert_eq!(DType::F32.dlpack(), (dl_code::FLOAT, 32, 1));
        assert_eq!(DType::Complex128.dlpack(), (dl_code::COMPLEX, 128, 1));
        assert_eq!(DType::BF16.dlpack(), (dl_code::BFLOAT, 16, 1));
    }

    #[test]
    fn unsupported_dlpack_types_are_named() {
        let e = DType::from_dlpack(dl_code::FLOAT, 32, 4).unwrap_err();
        assert!(e.to_string().contains("lanes 4"), "{e}");
        assert!(DType::from_dlpack(dl_code::FLOAT, 8, 1).is_err());
        assert!(DType::from_dlpack(3, 64, 1).is_err());
        let e = DType::from_name("float128").unwrap_err();
        assert!(e.to_string().contains("float128"));
    }

    #[test]
    fn bool_load_maps_any_nonzero_byte_to_true() {
        let bytes = [0u8, 1, 2, 255];
        let got: Vec<bool> = bytes
            .iter()
            // SAFETY: each pointer is a valid one-byte location.
            .map(|b| unsafe { bool::load((b as *const u8).cast()) })
            .collect();
        assert_eq!(got, [false, true, true, true]);
    }

    #[test]
    fn with_dtype_binds_the_matching_type() {
        for d in DType::ALL {
            assert_eq!(crate::with_dtype!(d, T => T::DTYPE), d);
        }
    }
}
