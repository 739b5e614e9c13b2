//! CPU tests: without an NVIDIA driver every entry point is an error, never a panic.
//! On a GPU machine the device-less assertions are skipped.

use memarray_cuda::{CudaError, Device, StreamRef, device_count, is_available};
use memarray_testing::gpu::report_skip;

#[test]
fn no_driver_means_unavailable_with_a_reason() {
    if is_available() {
        report_skip("a CUDA device is present; the no-driver path is not exercised");
        return;
    }
    let e = Device::get(0).unwrap_err();
    let CudaError::Unavailable { reason } = &e else {
        panic!("expected Unavailable, got {e:?}");
    };
    assert!(
        reason.contains("libcuda.so not found") || reason.contains("cuInit failed"),
        "{reason}"
    );
    let msg = e.to_string();
    assert!(msg.starts_with("CUDA is unavailable: "), "{msg}");
    assert!(
        msg.contains("nvidia-smi"),
        "the message names the fix: {msg}"
    );
    // The outcome is cached and stays the same.
    assert_eq!(Device::get(0).unwrap_err(), e);
    assert!(matches!(device_count(), Err(CudaError::Unavailable { .. })));
    assert!(matches!(Device::get(7), Err(CudaError::Unavailable { .. })));
}

#[test]
fn gpu_or_skip_returns_none_without_a_device() {
    if is_available() || std::env::var("MEMARRAY_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        return;
    }
    assert!(memarray_testing::gpu::gpu_or_skip().is_none());
    assert!(memarray_testing::gpu::gpus_or_skip(2).is_none());
}

#[test]
fn stream_handle_zero_is_refused() {
    // SAFETY: 0 is refused before it could be used.
    let e = unsafe { StreamRef::from_raw(0) }.unwrap_err();
    assert_eq!(e, CudaError::NullStream);
    assert!(e.to_string().contains("StreamRef::legacy"), "{e}");
    assert_eq!(StreamRef::legacy().raw(), 1);
    assert_eq!(StreamRef::per_thread().raw(), 2);
}
