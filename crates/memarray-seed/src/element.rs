//! The seed's arithmetic per element type, shared by the host reference and (in CUDA, in
//! `kernels-cuda/src/add_index.cu`) the kernel, so results match bit for bit.

use memarray_core::{Complex32, Complex64, Element, bf16, f16};

/// Adding an index sum to an element, as the seed's kernel does.
pub trait AddIndex: Element {
    /// Adds `delta`, wrapping for integers (as a CUDA kernel does), to the real part for
    /// complex, and as logical or for bool (any nonzero sum gives true).
    fn add_u64(self, delta: u64) -> Self;
}

macro_rules! add_index {
    ($($t:ty => |$s:ident, $d:ident| $add:expr;)*) => {$(
        impl AddIndex for $t {
            fn add_u64(self, $d: u64) -> Self {
                let $s = self;
                $add
            }
        }
    )*};
}

add_index! {
    i8 => |s, d| s.wrapping_add(d as i8);
    i16 => |s, d| s.wrapping_add(d as i16);
    i32 => |s, d| s.wrapping_add(d as i32);
    i64 => |s, d| s.wrapping_add(d as i64);
    u8 => |s, d| s.wrapping_add(d as u8);
    u16 => |s, d| s.wrapping_add(d as u16);
    u32 => |s, d| s.wrapping_add(d as u32);
    u64 => |s, d| s.wrapping_add(d);
    f16 => |s, d| f16::from_f32(s.to_f32() + d as f32);
    bf16 => |s, d| bf16::from_f32(s.to_f32() + d as f32);
    f32 => |s, d| s + d as f32;
    f64 => |s, d| s + d as f64;
    Complex32 => |s, d| Complex32::new(s.re + d as f32, s.im);
    Complex64 => |s, d| Complex64::new(s.re + d as f64, s.im);
    bool => |s, d| s || d != 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_wraps_like_the_kernel() {
        assert_eq!(250u8.add_u64(10), 4);
        assert_eq!((-128i8).add_u64(1), -127);
        assert_eq!(1.5f32.add_u64(2), 3.5);
        assert!(false.add_u64(3));
        assert!(!false.add_u64(0));
        assert_eq!(
            Complex32::new(1.0, 2.0).add_u64(3),
            Complex32::new(4.0, 2.0)
        );
        assert_eq!(bf16::from_f32(1.0).add_u64(2), bf16::from_f32(3.0));
    }
}
