//! Host-side element work on type-erased bytes: the reference `add_index_tuple`.

use memarray_core::{DType, with_dtype};

use crate::AddIndex;

/// Adds the sum of each element's indices to it, in place, over a C-contiguous buffer of
/// `shape`. Same arithmetic as the CUDA kernel (see [`AddIndex::add_u64`]), so results
/// match bit for bit.
pub(crate) fn add_index_tuple(dtype: DType, shape: &[usize], bytes: &mut [u8]) {
    with_dtype!(dtype, T => add_index_typed::<T>(shape, bytes))
}

fn add_index_typed<T: AddIndex>(shape: &[usize], bytes: &mut [u8]) {
    let n = bytes.len() / std::mem::size_of::<T>();
    debug_assert_eq!(
        n as u64,
        memarray_core::shape::checked_len(shape).unwrap_or(0)
    );
    let base = bytes.as_mut_ptr().cast::<T>();
    // An odometer over the index tuple keeps the running sum without divisions.
    let mut idx = vec![0usize; shape.len()];
    let mut sum = 0u64;
    for linear in 0..n {
        // SAFETY: linear < n elements of an aligned buffer of n * size_of::<T>() bytes
        // (host buffers are 64-byte aligned).
        unsafe {
            let p = base.add(linear);
            p.write(T::load(p).add_u64(sum));
        }
        for (i, &d) in idx.iter_mut().zip(shape).rev() {
            *i += 1;
            sum += 1;
            if *i < d {
                break;
            }
            sum -= d as u64;
            *i = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::shape::{checked_len, unravel};

    #[test]
    fn matches_unravel_reference() {
        let shape = [3usize, 4, 5];
        let n = checked_len(&shape).unwrap() as usize;
        let mut data: Vec<i32> = (0..n as i32).collect();
        add_index_tuple(DType::I32, &shape, bytemuck_bytes(&mut data));
        for (linear, &v) in data.iter().enumerate() {
            let s: u64 = unravel(&shape, linear as u64).unwrap().iter().sum();
            assert_eq!(v as u64, linear as u64 + s);
        }
    }

    #[test]
    fn zero_d_and_empty() {
        let mut one = [5.0f64];
        add_index_tuple(DType::F64, &[], bytemuck_bytes(&mut one));
        assert_eq!(one, [5.0]);
        let mut none: [f32; 0] = [];
        add_index_tuple(DType::F32, &[3, 0], bytemuck_bytes(&mut none));
    }

    fn bytemuck_bytes<T>(v: &mut [T]) -> &mut [u8] {
        // SAFETY: test data of plain numeric types; the byte view covers exactly v.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
    }
}
