//! The `memarray._memarray` extension module: Python bindings over memarray-core,
//! memarray-cuda and memarray-dlpack.
//!
//! One file per Rust module it binds (`array.rs` <-> `memarray_cuda::array`, `dlpack.rs`
//! <-> `memarray_dlpack`, `cuda.rs` <-> the CUDA types), each with a test file in
//! `tests/`. Errors map to one Python exception class per variant (`errors.rs`).

mod array;
mod batch;
mod born;
mod buffer;
mod byte_range;
mod cai;
mod conventions;
mod convert;
mod copy_settings;
mod copying;
mod cuda;
mod device;
mod distributed;
mod dlpack;
mod dtype;
mod element;
mod env;
mod errors;
mod familiar;
mod foreign;
mod fork;
mod gil;
mod graph;
mod held;
mod host_pool;
mod interop;
mod ipc;
mod launch;
mod locked;
mod numpy;
mod once;
mod pickle;
mod resources;
mod safetensors;
mod sources;
mod spill;
mod stream;
mod table;

use pyo3::prelude::*;

/// The address of a NumPy array's data, from its `__array_interface__`.
pub(crate) fn numpy_data_ptr(a: &Bound<'_, PyAny>) -> PyResult<usize> {
    let iface = a.getattr("__array_interface__")?;
    let (ptr, _ro): (usize, bool) = iface.get_item("data")?.extract()?;
    Ok(ptr)
}

#[pymodule]
fn _memarray(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    sources::register_all();
    // Every environment variable memarray reads is checked here: a bad value (not UTF-8,
    // not understood) is a ValueError naming it at import, never ignored or left to
    // fail at first use.
    host_pool::check_env()?;
    memarray_cuda::check_env()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    cai::cai_sync()?;
    m.add_function(wrap_pyfunction!(env::_env_switch, m)?)?;
    m.add_function(wrap_pyfunction!(env::_env_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(env::_env_text, m)?)?;
    m.add_class::<array::PyMemArray>()?;
    m.add_class::<dlpack::DLPackContext>()?;
    m.add_function(wrap_pyfunction!(dlpack::exchange::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(born::empty, m)?)?;
    m.add_function(wrap_pyfunction!(born::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(born::full, m)?)?;
    m.add_function(wrap_pyfunction!(born::load, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::load_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::save_safetensors, m)?)?;
    m.add_class::<born::Progress>()?;
    m.add_function(wrap_pyfunction!(device::_device_pair, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::producer_device, m)?)?;
    m.add_function(wrap_pyfunction!(batch::move_many, m)?)?;
    m.add_function(wrap_pyfunction!(batch::_numpy_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(batch::_last_batch_profile, m)?)?;
    m.add_function(wrap_pyfunction!(batch::_pack, m)?)?;
    m.add_function(wrap_pyfunction!(batch::_pack_layout, m)?)?;
    m.add_function(wrap_pyfunction!(batch::_share, m)?)?;
    m.add_function(wrap_pyfunction!(table::_check_table, m)?)?;
    m.add_function(wrap_pyfunction!(table::_pack_table, m)?)?;
    m.add_class::<table::PackTable>()?;
    m.add_function(wrap_pyfunction!(batch::_unpack, m)?)?;
    m.add_class::<ipc::PyIpcHandle>()?;
    m.add_function(wrap_pyfunction!(ipc::from_ipc_handle, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_handle_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::_dlpack_live_exports, m)?)?;
    m.add_class::<host_pool::HostBytes>()?;
    m.add_function(wrap_pyfunction!(pickle::_from_pickle, m)?)?;
    m.add("LockError", py.get_type::<errors::LockError>())?;
    m.add(
        "CudaUnavailableError",
        py.get_type::<errors::CudaUnavailableError>(),
    )?;
    m.add("CaptureError", py.get_type::<errors::CaptureError>())?;
    m.add(
        "OutOfMemoryError",
        py.get_type::<errors::OutOfMemoryError>(),
    )?;
    m.add("SUPPORTED_DTYPES", array::supported_dtype_names())?;
    m.add("MAX_NDIM", memarray_core::MAX_NDIM)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    cuda::register(m)?;
    resources::register(m)?;
    interop::register(m)?;
    distributed::register(m)?;
    spill::register(m)?;
    fork::register(m)?;
    Ok(())
}
