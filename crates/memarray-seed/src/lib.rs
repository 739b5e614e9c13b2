//! The seed's demo operation, `add_index_tuple`: each element gains the sum of its
//! indices (`a[i, j, k] += i + j + k`), on the host as the reference and on the device as
//! a kernel. The seed (the AMSO MemArray post) used it to show an array moving between
//! host and device; here, in a crate of its own above memarray-cuda, it is a user of the
//! arrays like any other, through memarray-cuda's public API only, as free functions:
//!
//! - [`add_index_tuple_host`]: moves the data to the host (if not there) and adds there.
//! - [`add_index_tuple_device`]: moves the data to the array's device on the stream (if not
//!   there) and launches the kernel on the same stream, without blocking the host.
//! - [`add_index_tuple`]: the kernel alone on a [`DeviceBuffer`](memarray_cuda::DeviceBuffer)
//!   of any dtype and up to 32 dimensions, 64-bit indexing, its PTX committed in
//!   `src/ptx/` (written by `kernels-cuda/build.sh` from `kernels-cuda/src`) and loaded
//!   through the same [`Module`](memarray_cuda::launch::Module) users' kernels load
//!   through, launched with `Function::launch_raw`.
//! - [`AddIndex`]: the arithmetic per element type, which host and kernel share.
//!
//! ```
//! use memarray_cuda::MemArray;
//!
//! let mut a = MemArray::<i32, 2>::new([2, 3])?; // zeroed
//! memarray_seed::add_index_tuple_host(&mut a, None)?;
//! assert_eq!(a.as_slice()?, &[0, 1, 2, 1, 2, 3]);
//! # Ok::<(), memarray_cuda::CudaError>(())
//! ```

mod element;
mod host;
mod kernel;

pub use element::AddIndex;
pub use kernel::{add_index_tuple, ptx};

use memarray_core::{Location, LockToken};
use memarray_cuda::{RawArray, Result, StreamRef};

/// Host version of the seed's kernel: adds the sum of each element's indices to it, after
/// moving the data to the host if it is on a device. `token` opens the array if it is
/// locked by its holder.
pub fn add_index_tuple_host(
    a: &mut (impl AsMut<RawArray> + ?Sized),
    token: Option<LockToken>,
) -> Result<()> {
    let a = a.as_mut();
    a.move_memory(Location::Host, None, true, token)?;
    let (dtype, shape) = (a.dtype(), a.shape().to_vec());
    host::add_index_tuple(dtype, &shape, a.host_bytes_mut(token)?);
    Ok(())
}

/// The seed's kernel on the device: moves the data to the array's device on `stream` (if
/// not there; the array's last stream there, else the legacy one, when `None`) and
/// launches `add_index_tuple` on the same stream, without blocking the host.
pub fn add_index_tuple_device(
    a: &mut (impl AsMut<RawArray> + ?Sized),
    stream: Option<StreamRef>,
    token: Option<LockToken>,
) -> Result<()> {
    let a = a.as_mut();
    let device = match a.location() {
        Location::Device(id) => id,
        Location::Host => a.device_id(),
    };
    let stream = a.stream_for(stream, device);
    let buf = a.kernel_operand(device, stream, token)?;
    let op = add_index_tuple(a.dtype(), &buf, a.shape(), stream)?;
    a.wrote(op)
}
