//! CUDA graphs from memarray: a capture records memarray's launches and copies
//! instead of running them, its graph replays them bit for bit, a refusal leaves the
//! capture valid, an abandoned or invalidated capture leaves the stream usable.

use std::sync::Arc;

use memarray_core::DType;
use memarray_cuda::graph::{Capture, CaptureMode};
use memarray_cuda::{CudaError, Device, DeviceBuffer, DeviceResource, Stream, StreamRef, copy};
use memarray_seed as seed;
use memarray_testing::gpu::gpu_or_skip;

const N: usize = 1 << 16;

fn u32s(buf: &DeviceBuffer, s: StreamRef) -> Vec<u32> {
    let mut out = vec![0u8; buf.len()];
    copy::copy_dtoh(&mut out, buf, 0, s).unwrap();
    out.chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn two_buffers(dev: &Arc<Device>, s: &Stream) -> (DeviceBuffer, DeviceBuffer) {
    let r = Arc::new(DeviceResource::new(dev));
    let a = DeviceBuffer::zeroed(dev, 4 * N, r.clone(), s.as_ref()).unwrap();
    let b = DeviceBuffer::zeroed(dev, 4 * N, r, s.as_ref()).unwrap();
    // The seed's module loads outside the capture (a[0] += 0: no change).
    drop(seed::add_index_tuple(DType::U32, &a, &[1], s.as_ref()).unwrap());
    s.synchronize().unwrap();
    (a, b)
}

#[test]
fn gpu_a_captured_kernel_and_copy_replay_bit_for_bit_in_every_mode() {
    let Some(dev) = gpu_or_skip() else { return };
    for mode in [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ] {
        let s = Stream::new(&dev).unwrap();
        let (a, b) = two_buffers(&dev, &s);
        assert_eq!(s.as_ref().capture(&dev).unwrap(), Capture::None);
        let capture = s.as_ref().begin_capture(&dev, mode).unwrap();
        assert!(matches!(
            s.as_ref().capture(&dev).unwrap(),
            Capture::Active { .. }
        ));
        drop(seed::add_index_tuple(DType::U32, &a, &[N], s.as_ref()).unwrap()); // a[i] += i
        drop(copy::copy_dtod(&b, 0, &a, 0, 4 * N, s.as_ref()).unwrap());
        let graph = capture.end().unwrap();
        assert_eq!(s.as_ref().capture(&dev).unwrap(), Capture::None);
        assert!(graph.node_count().unwrap() >= 2, "{mode:?}");
        assert!(
            u32s(&b, s.as_ref()).iter().all(|&x| x == 0),
            "captured work did not run"
        );
        let exec = graph.instantiate().unwrap();
        drop(graph); // the executable graph stands on its own
        exec.upload(s.as_ref()).unwrap().synchronize().unwrap();
        drop(exec.launch(s.as_ref()).unwrap());
        exec.launch(s.as_ref()).unwrap().synchronize().unwrap();
        let want: Vec<u32> = (0..N as u32).map(|i| 2 * i).collect();
        assert_eq!(
            u32s(&a, s.as_ref()),
            want,
            "{mode:?}: two replays of a[i] += i"
        );
        assert_eq!(
            u32s(&b, s.as_ref()),
            want,
            "{mode:?}: the copy replayed after the kernel"
        );
    }
}

#[test]
fn gpu_a_refusal_names_the_capture_and_leaves_it_valid() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let (a, b) = two_buffers(&dev, &s);
    s.as_ref()
        .refuse_under_capture(&dev, "a host wait")
        .unwrap();
    let capture = s.as_ref().begin_capture(&dev, CaptureMode::Global).unwrap();
    drop(copy::copy_dtod(&b, 0, &a, 0, 4 * N, s.as_ref()).unwrap());
    let e = s
        .as_ref()
        .refuse_under_capture(&dev, "a host wait")
        .unwrap_err();
    assert!(
        matches!(e, CudaError::Captured { what: "a host wait", stream, .. } if stream == s.raw()),
        "{e:?}"
    );
    assert!(e.to_string().contains("still valid"), "{e}");
    drop(copy::copy_dtod(&a, 0, &b, 0, 4 * N, s.as_ref()).unwrap());
    let graph = capture.end().expect("the capture survived the refusal");
    assert!(graph.node_count().unwrap() >= 2);
}

#[test]
fn gpu_an_abandoned_or_invalidated_capture_leaves_the_stream_usable() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let (a, b) = two_buffers(&dev, &s);
    {
        let _capture = s
            .as_ref()
            .begin_capture(&dev, CaptureMode::ThreadLocal)
            .unwrap();
        drop(copy::copy_dtod(&b, 0, &a, 0, 4 * N, s.as_ref()).unwrap());
    } // dropped without end: ended and destroyed
    assert_eq!(s.as_ref().capture(&dev).unwrap(), Capture::None);

    // A host wait on a capturing stream is illegal: the driver refuses it and the capture
    // is invalidated; ending it is the driver's error, and the stream works afterwards.
    let capture = s.as_ref().begin_capture(&dev, CaptureMode::Global).unwrap();
    assert!(s.synchronize().is_err(), "a host wait inside a capture");
    assert!(matches!(
        s.as_ref().capture(&dev).unwrap(),
        Capture::Invalidated { .. }
    ));
    assert!(capture.end().is_err(), "an invalidated capture's end fails");
    assert_eq!(s.as_ref().capture(&dev).unwrap(), Capture::None);
    drop(seed::add_index_tuple(DType::U32, &a, &[N], s.as_ref()).unwrap());
    let want: Vec<u32> = (0..N as u32).collect();
    assert_eq!(u32s(&a, s.as_ref()), want, "the stream runs work again");

    let e = StreamRef::legacy()
        .begin_capture(&dev, CaptureMode::Global)
        .unwrap_err();
    assert!(e.to_string().contains("default stream"), "{e}");
}
