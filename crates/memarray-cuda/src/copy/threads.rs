//! The host thread pool memarray's host-side work shares: persistent workers (no thread
//! spawned per call, rebuilt in a forked child), [`parallel`] over them, and the waits
//! that spin, then yield, before they sleep. Staged copies, `.npy` reads, `move_many`'s
//! packing and large host copies use it.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use crate::error::{CudaError, Result};

/// Host copies of at least this many bytes are split across threads ([`copy_host`]).
pub const PARALLEL_HOST_COPY: usize = 8 << 20;

/// The most lanes one call of `parallel` may ask for (staging's thread setting is
/// bounded by it).
pub const MAX_LANES: usize = 64;

/// Copies `src` into `dst` (equal lengths, checked), on several threads from
/// [`PARALLEL_HOST_COPY`] bytes up (one per 4 MiB, at most `max_lanes` and half the
/// cores): one thread's memcpy reaches 9-12 GB/s, host memory bandwidth several times
/// that. The caller passes the lane limit (the wing's door passes staging's host-to-device
/// thread setting).
pub fn copy_host(dst: &mut [u8], src: &[u8], max_lanes: usize) -> Result<()> {
    if dst.len() != src.len() {
        return Err(memarray_core::CoreError::CopyOutOfRange {
            offset: 0,
            len: src.len(),
            capacity: dst.len(),
        }
        .into());
    }
    let len = src.len();
    let lanes = if len < PARALLEL_HOST_COPY {
        1
    } else {
        // At most half the cores: a host copy must not starve the process's other threads
        // (on 2 cores it stays on the caller's thread).
        let half = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        let max = max_lanes.min(half);
        (len >> 22).clamp(1, max.max(1))
    };
    if lanes == 1 {
        dst.copy_from_slice(src);
        return Ok(());
    }
    let per = len.div_ceil(lanes);
    let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
    parallel(lanes, &|i| {
        let start = (i * per).min(len);
        let n = per.min(len - start);
        // SAFETY: lane i copies [start, start + n) of two distinct slices of `len`
        // bytes, borrowed (dst exclusively) until `parallel` returns; lanes' ranges are
        // disjoint.
        unsafe {
            std::ptr::copy_nonoverlapping((s + start) as *const u8, (d + start) as *mut u8, n)
        };
        Ok(())
    })
}

/// How long a worker (and a caller waiting for its workers) spins before it sleeps. Waking
/// a sleeping thread costs 10-50 us (the core may be in a deep idle state), as long as a
/// staged copy of 1 MiB takes; copies that follow each other within this window find
/// their lanes awake.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// How long a thread waiting inside a copy (for a piece, a DMA, its lanes) yields the
/// core between checks once [`SPIN`] has passed, before it sleeps: a lane descheduled
/// for a moment must not send every other waiter to sleep (on the device's virtual
/// machines a sleeping thread took hundreds of microseconds to wake, and copies of
/// 1-4 MiB fell from 60 us to 500 us).
const YIELD: std::time::Duration = std::time::Duration::from_millis(2);

/// Spins until `ready()` or [`SPIN`] has passed; whether `ready()` held.
pub(crate) fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return ready();
        }
    }
}

/// [`spin_until`], then yields the core between checks until [`YIELD`] has passed;
/// whether `ready()` held.
pub(crate) fn spin_then_yield_until(ready: impl Fn() -> bool) -> bool {
    if spin_until(&ready) {
        return true;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < YIELD {
        if ready() {
            return true;
        }
        std::thread::yield_now();
    }
    ready()
}

type Job = Box<dyn FnOnce() + Send>;

/// A persistent worker: a one-job mailbox and the thread that empties it.
struct Worker {
    job: Mutex<Option<Job>>,
    pending: AtomicBool,
    thread: std::thread::Thread,
}

impl Worker {
    fn give(&self, job: Job) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        self.pending.store(true, Ordering::Release);
        // Cheap unless the worker sleeps (then one futex wake).
        self.thread.unpark();
    }

    fn serve(&self) {
        loop {
            if !spin_until(|| self.pending.load(Ordering::Acquire)) {
                // A `give` between the check and `park` leaves the unpark token, so
                // `park` returns at once.
                std::thread::park();
                continue;
            }
            self.pending.store(false, Ordering::Relaxed);
            let job = self
                .job
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(job) = job {
                job();
            }
        }
    }
}

/// Most worker threads in the process (concurrent copies share them; a lane with no
/// worker left runs on the caller's thread).
const MAX_WORKERS: usize = 2 * MAX_LANES;

/// The idle workers, and how many exist, in the fork generation that started them (a
/// forked child has none of its parent's threads: it starts its own).
struct Pool {
    idle: Vec<Arc<Worker>>,
    started: usize,
    generation: u64,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            idle: Vec::new(),
            started: 0,
            generation: memarray_core::fork::generation(),
        })
    })
}

/// Up to `n` idle workers, starting threads while fewer than [`MAX_WORKERS`] exist. Each
/// serves one caller at a time: concurrent copies (an upload and a download, two
/// devices) get disjoint workers, and a job that itself runs `parallel` cannot wait on
/// its own thread.
fn take_workers(n: usize) -> Vec<Arc<Worker>> {
    let mut p = pool().lock().unwrap_or_else(PoisonError::into_inner);
    let generation = memarray_core::fork::generation();
    if p.generation != generation {
        // The parent's workers do not exist here; their handles are dropped unused.
        p.idle.clear();
        p.started = 0;
        p.generation = generation;
    }
    let keep = p.idle.len().saturating_sub(n);
    let mut got = p.idle.split_off(keep);
    while got.len() < n && p.started < MAX_WORKERS {
        match start_worker(p.started + 1) {
            Some(w) => {
                p.started += 1;
                got.push(w);
            }
            None => break, // fewer workers: the caller's thread takes the rest
        }
    }
    got
}

fn give_back(workers: Vec<Arc<Worker>>) {
    let mut p = pool().lock().unwrap_or_else(PoisonError::into_inner);
    // Workers of a parent (a fork happened while they were lent) are not kept.
    if p.generation == memarray_core::fork::generation() {
        p.idle.extend(workers);
    }
}

fn start_worker(number: usize) -> Option<Arc<Worker>> {
    let (tx, rx) = mpsc::channel::<Arc<Worker>>();
    let handle = std::thread::Builder::new()
        .name(format!("memarray-staging-{number}"))
        .spawn(move || {
            if let Ok(w) = rx.recv() {
                w.serve();
            }
        })
        .ok()?;
    let w = Arc::new(Worker {
        job: Mutex::new(None),
        pending: AtomicBool::new(false),
        thread: handle.thread().clone(),
    });
    tx.send(w.clone()).ok()?;
    Some(w)
}

/// Counts finished jobs; the waiter spins for [`SPIN`], then sleeps on the condvar.
struct Latch {
    left: AtomicUsize,
    error: Mutex<Option<CudaError>>,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Latch {
    fn done(&self, r: Result<()>) {
        if let Err(e) = r {
            self.error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock: a waiter between its check and its wait cannot miss this.
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.cv.notify_all();
        }
    }

    fn wait(&self) -> Option<CudaError> {
        if !spin_then_yield_until(|| self.left.load(Ordering::Acquire) == 0) {
            let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            while self.left.load(Ordering::Acquire) > 0 {
                g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
        }
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Runs `f(0)` .. `f(n - 1)`, `f(0)` on this thread and the others on workers, and
/// returns once all have finished: the first error, or a panic turned into one.
pub(crate) fn parallel(n: usize, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let run = |i: usize| {
        std::panic::catch_unwind(AssertUnwindSafe(|| f(i))).unwrap_or_else(|_| Err(panicked()))
    };
    if n <= 1 {
        return (0..n).try_for_each(run);
    }
    let helpers = take_workers(n - 1);
    let latch = Arc::new(Latch {
        left: AtomicUsize::new(helpers.len()),
        error: Mutex::new(None),
        lock: Mutex::new(()),
        cv: Condvar::new(),
    });
    // SAFETY: `f` is only used by jobs that finish before this function returns (the
    // latch below waits for every job given), so extending its lifetime is sound.
    let f_static: &'static (dyn Fn(usize) -> Result<()> + Sync) = unsafe { std::mem::transmute(f) };
    for (k, w) in helpers.iter().enumerate() {
        let latch = latch.clone();
        let i = k + 1;
        w.give(Box::new(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f_static(i)))
                .unwrap_or_else(|_| Err(panicked()));
            latch.done(r);
        }));
    }
    // Lane 0 and any lanes no worker could be started for run here.
    let mut first = None;
    for i in std::iter::once(0).chain(helpers.len() + 1..n) {
        if let Err(e) = run(i) {
            first.get_or_insert(e);
        }
    }
    let theirs = latch.wait();
    give_back(helpers);
    match first.or(theirs) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub(crate) fn panicked() -> CudaError {
    CudaError::InvalidArgument {
        what: "staged copy",
        detail: "a staging lane panicked".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ArrayError;

    #[test]
    fn host_copies_of_every_size_are_exact() {
        for len in [
            0usize,
            1,
            4095,
            PARALLEL_HOST_COPY - 1,
            PARALLEL_HOST_COPY + 12_345,
            37 << 20,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_host(&mut dst, &src, 8).unwrap();
            assert!(dst == src, "len {len}");
        }
        let mut short = vec![0u8; 3];
        assert!(copy_host(&mut short, &[1, 2, 3, 4], 8).is_err());
    }

    #[test]
    fn a_forked_child_starts_its_own_workers() {
        use std::sync::atomic::AtomicUsize;
        // The parent has idle workers; a child inherits their handles, not their threads.
        parallel(4, &|_| Ok(())).unwrap();
        // SAFETY: the child runs Rust code of this crate, then _exit (no harness code).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: ends the child if the work below hangs (the old pool handed jobs to
            // threads that do not exist in a child).
            unsafe { libc::alarm(10) };
            let total = AtomicUsize::new(0);
            let ok = parallel(4, &|_| {
                total.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .is_ok();
            let code = if ok && total.load(Ordering::SeqCst) == 4 {
                0
            } else {
                1
            };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            status, 0,
            "the child's parallel work hung or failed: status {status}"
        );
    }

    #[test]
    fn parallel_calls_nest_run_concurrently_and_wake_sleeping_workers() {
        use std::sync::atomic::AtomicUsize;
        let total = AtomicUsize::new(0);
        // Nested: a lane that itself runs `parallel` gets other workers, not itself.
        parallel(3, &|_| {
            parallel(3, &|_| {
                total.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(total.load(Ordering::SeqCst), 9);
        // Concurrent callers get disjoint workers; each index runs once per call.
        std::thread::scope(|sc| {
            for _ in 0..6 {
                sc.spawn(|| {
                    for _ in 0..50 {
                        parallel(4, &|_| {
                            total.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::SeqCst), 9 + 6 * 50 * 4);
        // Workers past their spin sleep, and a job wakes them.
        std::thread::sleep(SPIN * 5);
        parallel(4, &|_| {
            total.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(total.load(Ordering::SeqCst), 9 + 1200 + 4);
        assert!(pool().lock().unwrap().started <= MAX_WORKERS);
    }

    #[test]
    fn parallel_runs_every_index_once_and_reports_errors_and_panics() {
        let hits: Vec<std::sync::atomic::AtomicUsize> =
            (0..6).map(|_| Default::default()).collect();
        parallel(6, &|i| {
            hits[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert!(
            hits.iter()
                .all(|h| h.load(std::sync::atomic::Ordering::SeqCst) == 1)
        );
        let e = parallel(4, &|i| {
            if i == 2 {
                Err(ArrayError::NoDeviceCopy.into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(matches!(e, CudaError::Array(ArrayError::NoDeviceCopy)));
        let e = parallel(3, &|i| if i == 1 { panic!("lane") } else { Ok(()) }).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}
