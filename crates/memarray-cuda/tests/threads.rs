//! Thread stress: `SharedArray` and `MemArray` under `std::thread`.
//!
//! 16 threads run a fixed number of random operations on two shared arrays (and on
//! arrays of their own). Shared increments happen only under the array's lock (a
//! `LockGuard`), so the final data counts every successful increment exactly once; the
//! only error allowed is `Locked`, no array is left locked, and a watchdog fails the run
//! if it does not finish in time. With a GPU (`MEMARRAY_REQUIRE_GPU=1` on the device)
//! moves to and from the device join the mix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use memarray_core::{CoreError, DType, Location, LockToken};
use memarray_cuda::array::{Consumer, RawArray, SharedArray};
use memarray_cuda::{CudaError, MemArray, Result};
use memarray_testing::gpu::gpu_or_skip;

const THREADS: u64 = 16;
const ITERS: u64 = 2_000;
const N: usize = 64;
const DEADLINE: Duration = Duration::from_secs(120);

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn read_u64s(raw: &RawArray, token: Option<LockToken>) -> Result<Vec<u64>> {
    let mut bytes = vec![0u8; raw.nbytes()];
    raw.read_all(&mut bytes, token)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect())
}

fn write_u64s(raw: &mut RawArray, v: &[u64], token: Option<LockToken>) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    raw.write_all(&bytes, token)
}

/// All elements equal and within `0..=bound`: a snapshot never sees half an increment.
fn assert_uniform(v: &[u64], bound: u64) {
    assert!(v.iter().all(|&x| x == v[0]), "torn snapshot: {v:?}");
    assert!(v[0] <= bound);
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    shared_incs: AtomicU64,
    locked: AtomicU64,
}

fn worker(seed: u64, shared: &[Arc<SharedArray>; 2], counts: &Counts, gpu: bool) {
    let mut rng = Rng(seed);
    let bound = THREADS * ITERS;
    let mine = SharedArray::new(RawArray::zeros(DType::U64, &[N], 0).unwrap());
    let mut my_count = 0u64;
    let kinds = if gpu { 9 } else { 7 };
    for _ in 0..ITERS {
        let s = &shared[rng.below(2) as usize];
        let r: Result<u64> = match rng.below(kinds) {
            // Locked increment: read, add one, write back under the guard's token.
            0 => s.lock_guard().and_then(|g| {
                s.with(|raw| {
                    let t = Some(g.token());
                    raw.move_memory(Location::Host, None, true, t)?;
                    let v: Vec<u64> = read_u64s(raw, t)?.iter().map(|x| x + 1).collect();
                    write_u64s(raw, &v, t)
                })?;
                Ok(1)
            }),
            1 => s
                .with(|raw| read_u64s(raw, None))
                .map(|v| assert_uniform(&v, bound))
                .map(|()| 0),
            2 => s
                .try_clone(None)
                .and_then(|c| c.with(|raw| read_u64s(raw, None)))
                .map(|v| assert_uniform(&v, bound))
                .map(|()| 0),
            3 => s
                .with(|raw| {
                    let mut e = [0u8; 8];
                    raw.read_element(&[rng.below(N as u64)], &mut e, None)?;
                    Ok(u64::from_ne_bytes(e))
                })
                .map(|x| {
                    assert!(x <= bound);
                    0
                }),
            4 => shared[0].swap(&shared[1]).map(|()| 0),
            5 => s
                .with(|raw| raw.export_buffer(None, false, Consumer::Host))
                .map(|_| 0),
            6 => mine
                .with(|raw| {
                    let v: Vec<u64> = read_u64s(raw, None)?.iter().map(|x| x + 1).collect();
                    write_u64s(raw, &v, None)
                })
                .map(|()| {
                    my_count += 1;
                    0
                }),
            7 => s
                .with(|raw| raw.move_memory(Location::Device(0), None, rng.below(2) == 0, None))
                .map(|()| 0),
            _ => s
                .with(|raw| raw.move_memory(Location::Host, None, true, None))
                .map(|()| 0),
        };
        counts.ops.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(n) => {
                counts.shared_incs.fetch_add(n, Ordering::Relaxed);
            }
            Err(CudaError::Core(CoreError::Locked { held, .. })) => {
                assert_ne!(held, 0);
                counts.locked.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("only Locked may fail, got {e}"),
        }
    }
    let v = mine.with(|raw| read_u64s(raw, None)).unwrap();
    assert!(
        v.iter().all(|&x| x == my_count),
        "private count {v:?} != {my_count}"
    );
}

fn stress(gpu: bool) {
    let shared: [Arc<SharedArray>; 2] = std::array::from_fn(|_| {
        Arc::new(SharedArray::new(
            RawArray::zeros(DType::U64, &[N], 0).unwrap(),
        ))
    });
    let counts = Arc::new(Counts::default());
    let (done_tx, done_rx) = mpsc::channel();
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (shared, counts, done) = (shared.clone(), counts.clone(), done_tx.clone());
            std::thread::spawn(move || {
                worker(0x9E37_79B9 + i * 7919, &shared, &counts, gpu);
                let _ = done.send(());
            })
        })
        .collect();
    // Watchdog: every thread must report within the deadline (a deadlock fails here).
    for k in 0..THREADS {
        let left = DEADLINE.saturating_sub(start.elapsed());
        if done_rx.recv_timeout(left).is_err() {
            let panicked = handles.iter().filter(|h| h.is_finished()).count();
            panic!(
                "watchdog: {k} of {THREADS} threads reported after {DEADLINE:?} ({panicked} finished, possibly by panicking)"
            );
        }
    }
    for h in handles {
        h.join().expect("a worker panicked");
    }
    let elapsed = start.elapsed();
    for s in &shared {
        assert!(!s.is_locked(), "left locked by {:?}", s.lock_holder());
        s.with(|raw| raw.move_memory(Location::Host, None, true, None))
            .unwrap();
    }
    let a = shared[0].with(|raw| read_u64s(raw, None)).unwrap();
    let b = shared[1].with(|raw| read_u64s(raw, None)).unwrap();
    let incs = counts.shared_incs.load(Ordering::Relaxed);
    assert!(incs > 0);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x + y, incs, "every successful increment exactly once");
    }
    assert_eq!(counts.ops.load(Ordering::Relaxed), THREADS * ITERS);
    eprintln!(
        "stress ({}): {THREADS} threads, {} operations, {incs} shared increments, {} Locked, {elapsed:.2?}",
        if gpu { "gpu" } else { "cpu" },
        THREADS * ITERS,
        counts.locked.load(Ordering::Relaxed)
    );
}

#[test]
fn shared_array_thread_stress_cpu() {
    stress(false);
}

#[test]
fn shared_array_thread_stress_gpu() {
    if gpu_or_skip().is_none() {
        return;
    }
    stress(true);
}

/// The typed array is `Send + Sync`: shared read-only through `&`, and behind a `Mutex`
/// for writes; its lock refuses other threads' accesses while held.
#[test]
fn typed_memarray_across_threads() {
    let a = Arc::new(Mutex::new(MemArray::<u32, 2>::new([8, 8]).unwrap()));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..200 {
                    let mut g = a.lock().unwrap();
                    let v = g.get([3, 4]).unwrap();
                    g.set([3, 4], v + 1).unwrap();
                }
            });
        }
    });
    assert_eq!(a.lock().unwrap().get([3, 4]).unwrap(), 200 * THREADS as u32);
    // A lock taken by one thread refuses reads from the others until released.
    let token = a.lock().unwrap().try_lock().unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let e = a.lock().unwrap().get([0, 0]).unwrap_err();
                assert!(matches!(e, CudaError::Core(CoreError::Locked { held, .. }) if held == token.id()));
            });
        }
    });
    a.lock().unwrap().unlock(token).unwrap();
    assert!(!a.lock().unwrap().is_locked());
}

/// Swaps in opposite directions from many threads never deadlock (address-ordered).
#[test]
fn opposite_swaps_do_not_deadlock() {
    let x = Arc::new(SharedArray::new(
        RawArray::zeros(DType::U8, &[4], 0).unwrap(),
    ));
    let y = Arc::new(SharedArray::new(
        RawArray::zeros(DType::U8, &[9], 0).unwrap(),
    ));
    let (tx, rx) = mpsc::channel();
    for i in 0..8 {
        let (x, y, tx) = (x.clone(), y.clone(), tx.clone());
        std::thread::spawn(move || {
            for _ in 0..2_000 {
                if i % 2 == 0 { x.swap(&y) } else { y.swap(&x) }.unwrap();
            }
            let _ = tx.send(());
        });
    }
    for _ in 0..8 {
        rx.recv_timeout(DEADLINE)
            .expect("watchdog: swaps deadlocked");
    }
    let lens: Vec<usize> = [&x, &y].iter().map(|a| a.with(|r| r.nbytes())).collect();
    assert_eq!(lens.iter().sum::<usize>(), 13);
    x.swap(&x).unwrap();
}
