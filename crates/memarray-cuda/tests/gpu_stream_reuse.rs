//! Dropped streams go back to their device and are reused (alone in this binary, so no
//! other test takes the idle stream first).

use memarray_cuda::Stream;
use memarray_testing::gpu::gpu_or_skip;

#[test]
fn gpu_dropped_streams_are_reused() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let raw = s.raw();
    assert!(raw > 2);
    let stale = s.as_ref();
    drop(s);
    // The handle stays a live stream: using it is an ordinary operation.
    stale.synchronize(&dev).unwrap();
    let again: Vec<Stream> = (0..4).map(|_| Stream::new(&dev).unwrap()).collect();
    assert!(
        again.iter().any(|s| s.raw() == raw),
        "the idle stream was reused"
    );
}
