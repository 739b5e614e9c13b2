//! Device arguments: C passes device ordinals as `int`.

use std::sync::Arc;

use memarray_cuda::Device;

use crate::error::{Error, Result};

/// The device `id` names: an error for a negative id or one the process does not see.
pub(crate) fn device(id: i32) -> Result<Arc<Device>> {
    let id = u32::try_from(id).map_err(|_| Error::arg(format!("device {id} is negative")))?;
    Ok(Device::get(id)?)
}
