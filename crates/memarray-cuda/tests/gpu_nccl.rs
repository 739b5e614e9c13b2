//! NCCL collectives on device arrays (feature `nccl`). One-rank communicators run on any
//! GPU; the 2-GPU cases skip on one GPU (fail under MEMARRAY_REQUIRE_PEER=1). Without
//! libnccl every test skips with the reason (fails under MEMARRAY_REQUIRE_PEER=1).

mod common;

use common::i32s;
use memarray_core::{DType, Location};
use memarray_cuda::nccl::{Comm, NcclError, ReduceOp, group};
use memarray_cuda::{ArrayError, CudaError, RawArray, Stream, device_count};
use memarray_seed as seed;
use memarray_testing::gpu::{gpu_or_skip, gpus_or_skip, nccl_or_skip};

fn on(device: u32, values: &[i32]) -> RawArray {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut a = RawArray::from_bytes(DType::I32, &[values.len()], &bytes, device).unwrap();
    a.move_memory(Location::Device(device), None, false, None)
        .unwrap();
    a
}

#[test]
fn gpu_one_rank_collectives_copy_and_order_after_pending_work() {
    let Some(dev) = gpu_or_skip() else { return };
    if !nccl_or_skip(|| memarray_cuda::nccl::load(None)) {
        return;
    }
    let info = memarray_cuda::nccl::load(None).unwrap();
    eprintln!("NCCL {:?} from {}", info.version, info.path.display());
    let comm = Comm::init_all(&[0]).unwrap().remove(0);
    assert_eq!((comm.rank(), comm.size(), comm.device_id()), (0, 1, 0));
    // Pending kernel work on another stream must finish before the collective reads.
    let s = Stream::new(&dev).unwrap();
    let mut a =
        RawArray::zeros_on(DType::I32, &[1 << 20], Location::Device(0), None, None).unwrap();
    for _ in 0..3 {
        seed::add_index_tuple_device(&mut a, Some(s.as_ref()), None).unwrap();
    }
    let mut out =
        RawArray::empty_on(DType::I32, &[1 << 20], Location::Device(0), None, None).unwrap();
    comm.all_reduce(&a, &mut out, ReduceOp::Sum, None).unwrap();
    let want: Vec<i32> = (0..1 << 20).map(|i| 3 * i).collect();
    assert_eq!(i32s(&out), want);
    comm.all_reduce_in_place(&mut a, ReduceOp::Max, Some(s.as_ref()))
        .unwrap();
    comm.broadcast(&mut a, 0, None).unwrap();
    assert_eq!(i32s(&a), want);
    // Operand errors: wrong size, host data, a dtype NCCL cannot reduce, a bad root.
    let mut small = on(0, &[1, 2, 3]);
    let e = comm
        .all_reduce(&a, &mut small, ReduceOp::Sum, None)
        .unwrap_err();
    assert!(matches!(e, NcclError::Call { .. }), "{e}");
    let host = RawArray::zeros(DType::I32, &[4], 0).unwrap();
    let e = comm
        .all_reduce(&host, &mut small, ReduceOp::Sum, None)
        .unwrap_err();
    assert!(
        matches!(
            e,
            NcclError::Call { .. }
                | NcclError::Cuda(CudaError::Array(ArrayError::NotOnDevice { .. }))
        ),
        "{e}"
    );
    let mut b = RawArray::zeros_on(DType::Bool, &[4], Location::Device(0), None, None).unwrap();
    assert!(
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, None)
            .is_err()
    );
    comm.broadcast(&mut b, 0, None).unwrap(); // bytes: any dtype
    assert!(comm.broadcast(&mut a, 1, None).is_err());
    // A locked operand is refused before NCCL sees it.
    let t = a.try_lock().unwrap();
    assert!(
        comm.all_reduce_in_place(&mut a, ReduceOp::Sum, None)
            .is_err()
    );
    a.unlock(t).unwrap();
}

#[test]
fn gpu_a_device_past_the_visible_ones_is_a_clear_error() {
    if gpu_or_skip().is_none() || !nccl_or_skip(|| memarray_cuda::nccl::load(None)) {
        return;
    }
    // On one GPU this is the "two GPUs need two devices" error; on more, the same check.
    let n = device_count().unwrap();
    let e = Comm::init_all(&[0, n]).unwrap_err().to_string();
    assert!(
        e.contains(&format!("needs cuda:{n}")) && e.contains(&format!("sees {n} device")),
        "{e}"
    );
}

#[test]
fn gpu_two_device_collectives_are_exact() {
    if gpus_or_skip(2).is_none() || !nccl_or_skip(|| memarray_cuda::nccl::load(None)) {
        return;
    }
    let comms = Comm::init_all(&[0, 1]).unwrap();
    let n = 3 * (1 << 18) + 7;
    let inputs: Vec<Vec<i32>> = (0..2)
        .map(|r| (0..n as i32).map(|i| i * (r + 1) + r).collect())
        .collect();
    // all-reduce (sum, max) into fresh arrays.
    let mut sends: Vec<RawArray> = (0..2).map(|r| on(r as u32, &inputs[r])).collect();
    let mut outs: Vec<RawArray> = (0..2)
        .map(|r| RawArray::empty_on(DType::I32, &[n], Location::Device(r), None, None).unwrap())
        .collect();
    group(|| {
        for ((c, s), o) in comms.iter().zip(&sends).zip(outs.iter_mut()) {
            c.all_reduce(s, o, ReduceOp::Sum, None)?;
        }
        Ok(())
    })
    .unwrap();
    let sum: Vec<i32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
    for o in &outs {
        assert_eq!(i32s(o), sum);
    }
    group(|| {
        for (c, s) in comms.iter().zip(sends.iter_mut()) {
            c.all_reduce_in_place(s, ReduceOp::Max, None)?;
        }
        Ok(())
    })
    .unwrap();
    let max: Vec<i32> = (0..n).map(|i| inputs[0][i].max(inputs[1][i])).collect();
    for s in &sends {
        assert_eq!(i32s(s), max);
    }
    // all-gather: rank order.
    let small: Vec<RawArray> = (0..2)
        .map(|r| on(r, &[10 * r as i32, 10 * r as i32 + 1]))
        .collect();
    let mut gathered: Vec<RawArray> = (0..2)
        .map(|r| RawArray::empty_on(DType::I32, &[4], Location::Device(r), None, None).unwrap())
        .collect();
    group(|| {
        for ((c, s), g) in comms.iter().zip(&small).zip(gathered.iter_mut()) {
            c.all_gather(s, g, None)?;
        }
        Ok(())
    })
    .unwrap();
    for g in &gathered {
        assert_eq!(i32s(g), vec![0, 1, 10, 11]);
    }
    // reduce-scatter: rank r gets block r of the sum.
    let full: Vec<RawArray> = (0..2)
        .map(|r| on(r, &[1 + r as i32, 2, 3, 4 * (r as i32 + 1)]))
        .collect();
    let mut blocks: Vec<RawArray> = (0..2)
        .map(|r| RawArray::empty_on(DType::I32, &[2], Location::Device(r), None, None).unwrap())
        .collect();
    group(|| {
        for ((c, s), b) in comms.iter().zip(&full).zip(blocks.iter_mut()) {
            c.reduce_scatter(s, b, ReduceOp::Sum, None)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(i32s(&blocks[0]), vec![3, 4]);
    assert_eq!(i32s(&blocks[1]), vec![6, 12]);
    // broadcast from rank 1.
    let mut b: Vec<RawArray> = (0..2).map(|r| on(r, &[r as i32 * 7; 5])).collect();
    group(|| {
        for (c, a) in comms.iter().zip(b.iter_mut()) {
            c.broadcast(a, 1, None)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(i32s(&b[0]), vec![7; 5]);
    // send / recv both ways in one group.
    let x0 = on(0, &[1, 2, 3]);
    let x1 = on(1, &[4, 5, 6]);
    let mut y0 = on(0, &[0; 3]);
    let mut y1 = on(1, &[0; 3]);
    group(|| {
        comms[0].send(&x0, 1, None)?;
        comms[0].recv(&mut y0, 1, None)?;
        comms[1].send(&x1, 0, None)?;
        comms[1].recv(&mut y1, 0, None)
    })
    .unwrap();
    assert_eq!(i32s(&y0), vec![4, 5, 6]);
    assert_eq!(i32s(&y1), vec![1, 2, 3]);
    // An operand on the other rank's device is refused.
    let mut wrong = on(1, &[0; 3]);
    let e = comms[0].recv(&mut wrong, 1, None).unwrap_err();
    assert!(
        matches!(
            e,
            NcclError::Cuda(CudaError::Array(ArrayError::NotOnDevice {
                expected: 0,
                ..
            }))
        ),
        "{e}"
    );
}

#[test]
fn gpu_an_aborted_communicator_refuses_every_later_call() {
    if gpu_or_skip().is_none() || !nccl_or_skip(|| memarray_cuda::nccl::load(None)) {
        return;
    }
    let comm = Comm::init_all(&[0]).unwrap().remove(0);
    let mut a = on(0, &[1, 2, 3]);
    comm.all_reduce_in_place(&mut a, ReduceOp::Sum, None)
        .unwrap();
    assert!(!comm.is_aborted());
    comm.abort().unwrap();
    assert!(comm.is_aborted());
    let e = comm
        .all_reduce_in_place(&mut a, ReduceOp::Sum, None)
        .unwrap_err();
    assert!(
        matches!(
            e,
            NcclError::Aborted {
                call: "ncclAllReduce"
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("make a new one"), "{e}");
    assert!(matches!(
        comm.broadcast(&mut a, 0, None).unwrap_err(),
        NcclError::Aborted { .. }
    ));
    comm.abort().unwrap(); // a second abort does nothing
    assert_eq!(i32s(&a), vec![1, 2, 3], "the array stays usable");
    drop(comm); // no destroy after the abort freed it
    let nccl_parked = memarray_cuda::parked::kept()
        .into_iter()
        .filter(|p| p.during.contains("NCCL"))
        .count();
    assert_eq!(nccl_parked, 0, "a destroy ran after the abort");
}

#[test]
fn gpu_abort_frees_a_receive_whose_sender_never_sends() {
    let Some(devs) = gpus_or_skip(2) else { return };
    if !nccl_or_skip(|| memarray_cuda::nccl::load(None)) {
        return;
    }
    let comms = Comm::init_all(&[0, 1]).unwrap();
    // Connect the pair first (its first send / receive sets up the channel).
    let x = on(0, &[1, 2, 3]);
    let mut y = on(1, &[0; 3]);
    group(|| {
        comms[0].send(&x, 1, None)?;
        comms[1].recv(&mut y, 0, None)
    })
    .unwrap();
    assert_eq!(i32s(&y), vec![1, 2, 3]);
    // Rank 1 waits for a message rank 0 never sends; aborting from another thread frees it.
    let s = Stream::new(&devs[1]).unwrap();
    let mut waiting =
        RawArray::zeros_on(DType::I32, &[1 << 20], Location::Device(1), None, None).unwrap();
    comms[1].recv(&mut waiting, 0, Some(s.as_ref())).unwrap();
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(500));
            comms[1].abort().unwrap();
            comms[0].abort().unwrap();
        });
        s.synchronize().unwrap();
    });
    let waited = start.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(400),
        "returned before the abort"
    );
    assert!(comms[0].is_aborted() && comms[1].is_aborted());
    let e = comms[1].recv(&mut waiting, 0, None).unwrap_err();
    assert!(matches!(e, NcclError::Aborted { call: "ncclRecv" }), "{e}");
}
