//! CUDA graphs from memarray: a capture records memarray's launches and copies
//! instead of running them, its graph replays them bit for bit, a refusal leaves the
//! capture valid, an abandoned or invalidated capture leaves the stream usable.

use std::sync::Arc;

use memarray_core::{DType, Location};
use memarray_cuda::array::{RawArray, SharedArray};
use memarray_cuda::graph::{Capture, CaptureMode};
use memarray_cuda::{CudaError, Device, DeviceBuffer, DeviceResource, Stream, StreamRef, copy};
use memarray_seed as seed;
use memarray_testing::gpu::gpu_or_skip;

const N: usize = 1 << 16;

/// CUDA's three capture modes.
const MODES: [CaptureMode; 3] = [
    CaptureMode::Global,
    CaptureMode::ThreadLocal,
    CaptureMode::Relaxed,
];

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
    for mode in MODES {
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

    // A host wait on a capturing stream could never end: memarray refuses it, typed, and
    // the capture goes on.
    let capture = s.as_ref().begin_capture(&dev, CaptureMode::Global).unwrap();
    let e = s.synchronize().unwrap_err();
    assert!(matches!(e, CudaError::Captured { .. }), "{e:?}");
    assert!(matches!(
        s.as_ref().capture(&dev).unwrap(),
        Capture::Active { .. }
    ));
    // The driver's own wait is refused too, and invalidates the capture: ending it is the
    // driver's error, and the stream works afterwards.
    let ctx = dev.bind().unwrap();
    // SAFETY: a live stream of the context bound above.
    let r = unsafe { cudarc::driver::sys::cuStreamSynchronize(s.raw() as _) };
    drop(ctx);
    assert_ne!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
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

/// `a`'s elements, read on the host (after its pending work, as any host read).
fn shared_u32s(a: &SharedArray) -> Vec<u32> {
    let mut out = vec![0u8; 4 * N];
    a.with(|raw| raw.read_all(&mut out, None)).unwrap();
    out.chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// An array on the device of `s`, its elements `a[i] = i` (the seed's kernel, eagerly:
/// which loads the module outside any capture).
fn shared_on_device(s: &Stream) -> SharedArray {
    let a = SharedArray::new(RawArray::zeros(DType::U32, &[N], 0).unwrap());
    a.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
        .unwrap();
    a
}

#[test]
fn gpu_a_graph_holds_its_arrays_and_each_launch_is_their_pending_work() {
    let Some(dev) = gpu_or_skip() else { return };
    for mode in MODES {
        let s = Stream::new(&dev).unwrap();
        let a = shared_on_device(&s);
        let capture = s.as_ref().begin_capture(&dev, mode).unwrap();
        a.with(|raw| seed::add_index_tuple_device(raw, None, None)) // the array's stream: s
            .unwrap();
        a.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
            .unwrap();
        let graph = capture.end().unwrap();
        assert_eq!(graph.member_count(), 1, "{mode:?}: one array, once");
        let exec = graph.instantiate().unwrap();
        drop(graph);
        // The spiller leaves a graph's arrays be; asked to, it says why not.
        let e = a.evict().unwrap_err();
        assert!(e.to_string().contains("graph"), "{e}");
        // Two launches, no host wait: the host read waits for them as the array's work.
        drop(exec.launch(s.as_ref()).unwrap());
        drop(exec.launch(s.as_ref()).unwrap());
        let want: Vec<u32> = (0..N as u32).map(|i| 5 * i).collect();
        assert_eq!(
            shared_u32s(&a),
            want,
            "{mode:?}: 1 eager + 2 x 2 replayed steps"
        );
        // The host copy written after the graph ran goes up before the next launch, into
        // the memory the capture used.
        a.with(|raw| raw.write_all(&vec![0u8; 4 * N], None))
            .unwrap();
        drop(exec.launch(s.as_ref()).unwrap());
        let twice: Vec<u32> = (0..N as u32).map(|i| 2 * i).collect();
        assert_eq!(
            shared_u32s(&a),
            twice,
            "{mode:?}: the host write, then one launch"
        );
        // Dropped by its owner, the array lives on in the graph: launches stay valid.
        drop(a);
        exec.launch(s.as_ref()).unwrap().synchronize().unwrap();
    }
}

#[test]
fn gpu_a_launch_after_an_array_moved_refuses_and_launches_nothing() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let (a, b) = (shared_on_device(&s), shared_on_device(&s));
    let capture = s
        .as_ref()
        .begin_capture(&dev, CaptureMode::ThreadLocal)
        .unwrap();
    for x in [&a, &b] {
        x.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
            .unwrap();
    }
    let exec = capture.end().unwrap().instantiate().unwrap();
    // A move to the host keeps the device memory (the mirror): the launch brings the
    // data back into it and runs.
    a.with(|raw| raw.move_memory(Location::Host, None, true, None))
        .unwrap();
    drop(exec.launch(s.as_ref()).unwrap());
    let twice: Vec<u32> = (0..N as u32).map(|i| 2 * i).collect();
    assert_eq!(shared_u32s(&a), twice);
    // A swap gives the array other device memory: refused, nothing launched.
    let c = shared_on_device(&s);
    a.swap(&c).unwrap();
    let e = exec.launch(s.as_ref()).unwrap_err();
    let CudaError::GraphArrayMoved { captured, now, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(Some(now), a.with(|raw| raw.device_ptr(None)).ok());
    assert_ne!(captured, now);
    assert!(e.to_string().contains("capture the work again"), "{e}");
    let once: Vec<u32> = (0..N as u32).collect();
    assert_eq!(shared_u32s(&a), once, "the swapped-in data is as it was");
    assert_eq!(shared_u32s(&b), twice, "nothing launched: b is as it was");
    // Swapped back, the array's memory is the capture's again: the launch runs.
    a.swap(&c).unwrap();
    drop(exec.launch(s.as_ref()).unwrap());
    let thrice: Vec<u32> = (0..N as u32).map(|i| 3 * i).collect();
    assert_eq!(shared_u32s(&a), thrice);
    assert_eq!(shared_u32s(&b), thrice);
}

#[test]
fn gpu_a_graph_on_the_second_device_holds_its_arrays_and_moves_peer_data_in() {
    let Some(devs) = memarray_testing::gpu::gpus_or_skip(2) else {
        return;
    };
    let d1 = &devs[1];
    let s = Stream::new(d1).unwrap();
    // a on device 1 (written by the seed's kernel there); b on device 0, moved to device 1
    // inside the capture (a peer copy, captured) and then written there.
    let a = SharedArray::new(RawArray::zeros(DType::U32, &[N], 1).unwrap());
    a.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
        .unwrap();
    let b = SharedArray::new(RawArray::zeros(DType::U32, &[N], 0).unwrap());
    b.with(|raw| raw.move_memory(Location::Device(0), None, true, None))
        .unwrap();
    s.synchronize().unwrap();
    let capture = s
        .as_ref()
        .begin_capture(d1, CaptureMode::ThreadLocal)
        .unwrap();
    a.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
        .unwrap();
    b.with(|raw| raw.move_memory(Location::Device(1), Some(s.as_ref()), false, None))
        .unwrap();
    b.with(|raw| seed::add_index_tuple_device(raw, Some(s.as_ref()), None))
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    drop(exec.launch(s.as_ref()).unwrap());
    drop(exec.launch(s.as_ref()).unwrap());
    let want = |k: u32| -> Vec<u32> { (0..N as u32).map(|i| k * i).collect() };
    assert_eq!(
        shared_u32s(&a),
        want(3),
        "1 eager + 2 replayed steps on device 1"
    );
    // Each launch copies in again what the capture copied (b's device-0 memory, zero,
    // kept by the graph), then adds i.
    assert_eq!(
        shared_u32s(&b),
        want(1),
        "the captured peer copy, then one step"
    );
}
