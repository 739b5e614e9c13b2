//! Fork safety: a process may fork at any moment (`multiprocessing`'s default on Linux), and
//! a child must never inherit a lock that a thread of the parent held, or a thread pool whose
//! threads it does not have.
//!
//! Two mechanisms, as mature runtimes use them:
//! - **Sections.** Work that holds memarray's locks while the host language's own lock is
//!   released (Python's GIL) runs inside a [`Section`]. Before a fork, the front end calls
//!   [`begin_fork`], waits until [`in_flight`] is 0, forks, and calls [`end_fork`] in the
//!   parent and the child: no section, and so none of the locks they take, is held across the
//!   fork. A section entered by a thread that holds the host language's lock ([`section`])
//!   never waits (the forking thread takes that lock before it forks, so such a section is
//!   always counted before the last check); a front end that holds no lock of memarray's at
//!   that point waits first while [`forking`] (else new sections could starve the fork); one
//!   entered by any other thread ([`section_waiting`]) waits while a fork is being prepared.
//!   A thread already inside a section never waits for a fork ([`in_section`]): its outer
//!   section is what the fork waits for (a producer's deleter that calls back into memarray
//!   from inside an import is such a nested section), so waiting would never end.
//! - **Generations.** [`generation`] counts the forks this process descends from (a
//!   `pthread_atfork` child handler adds one). Process-local state that cannot cross a fork
//!   (worker threads, a cache of driver handles) remembers the generation it was made in and
//!   is rebuilt when it differs.
//!
//! ```
//! use memarray_core::fork;
//!
//! let before = fork::generation();
//! {
//!     let _s = fork::section();
//!     assert_eq!(fork::in_flight(), 1);
//! }
//! assert_eq!(fork::in_flight(), 0);
//! assert_eq!(fork::generation(), before); // no fork here
//! ```

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

thread_local! {
    // Sections this thread holds (a `Section` is dropped on the thread that made it).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

static GENERATION: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static FORKING: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // The child has one thread, the one that forked: only its own sections are in flight
    // (their drops count down). A const-initialised thread local without a destructor is a
    // plain TLS read, as async-signal-safe as the atomics.
    IN_FLIGHT.store(DEPTH.with(Cell::get), Ordering::SeqCst);
    FORKING.store(false, Ordering::SeqCst);
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only stores to atomics (async-signal-safe, as a
        // child handler must be); the handler lives for the whole process.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// The number of forks this process descends from (0 in a process that was not forked
/// after memarray started). State made in another generation belongs to an ancestor.
pub fn generation() -> u64 {
    install();
    GENERATION.load(Ordering::SeqCst)
}

/// Work that may hold memarray's locks; while one lives, a fork waits (see the module
/// docs). Sections nest. A section ends on the thread that entered it: it may be moved into
/// a closure that runs on that thread (Python's `detach`), never to another thread.
#[must_use = "the section ends when this is dropped"]
#[derive(Debug)]
pub struct Section(());

impl Section {
    fn enter() -> Section {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        DEPTH.with(|d| d.set(d.get() + 1));
        Section(())
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the calling thread is inside a section now. Such a thread never waits for a
/// fork: the fork waits for its section to end.
pub fn in_section() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// Enters a section from a thread that holds the host language's lock (Python's GIL, held
/// by the thread that forks): never waits.
pub fn section() -> Section {
    install();
    Section::enter()
}

/// Enters a section from a thread that may run while a fork is being prepared (a foreign
/// allocator's callback, a C caller): waits until the fork is done, unless this thread is
/// already inside a section (then the fork is waiting for it). Call it before taking any
/// lock.
pub fn section_waiting() -> Section {
    install();
    loop {
        let section = Section::enter();
        // SeqCst on both sides: either the forking thread sees this count, or this thread
        // sees its flag.
        if !FORKING.load(Ordering::SeqCst) || DEPTH.with(Cell::get) > 1 {
            return section;
        }
        drop(section);
        wait_fork_done();
    }
}

/// Whether a fork is being prepared ([`begin_fork`] without [`end_fork`] yet).
pub fn forking() -> bool {
    FORKING.load(Ordering::SeqCst)
}

/// Waits (sleeping) while a fork is being prepared. A thread that holds the host
/// language's lock releases it first, and holds none of memarray's locks.
pub fn wait_fork_done() {
    while forking() {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Sections alive now.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Whether sections of other threads than the caller are alive now: what a fork waits for.
pub fn others_in_flight() -> bool {
    in_flight() > DEPTH.with(Cell::get)
}

/// Marks a fork as being prepared: [`section_waiting`] waits from now until [`end_fork`].
pub fn begin_fork() {
    install();
    FORKING.store(true, Ordering::SeqCst);
}

/// Waits (sleeping) until no section is in flight but the calling thread's own. Call it
/// without the host language's lock, after [`begin_fork`].
pub fn wait_idle() {
    let mut spins = 0u32;
    while others_in_flight() {
        if spins < 100 {
            std::thread::yield_now();
            spins += 1;
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Ends what [`begin_fork`] started (in the parent and in the child).
pub fn end_fork() {
    FORKING.store(false, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    // One test: the counters are global, and tests of one binary run at once.
    #[test]
    fn sections_count_and_a_fork_in_preparation_holds_back_waiting_ones() {
        let base = in_flight();
        let a = section();
        let b = section();
        assert_eq!(in_flight(), base + 2);
        drop(a);
        drop(b);
        assert_eq!(in_flight(), base);

        begin_fork();
        let entered = Arc::new(AtomicBool::new(false));
        let e = entered.clone();
        let t = std::thread::spawn(move || {
            let _s = section_waiting();
            e.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !entered.load(Ordering::SeqCst),
            "entered while a fork was prepared"
        );
        // A section of a thread holding the host lock is never held back, and neither is
        // one nested inside it (the fork waits for the outer one).
        let s = section();
        assert!(in_section());
        assert_eq!(in_flight(), base + 1);
        let (tx, rx) = std::sync::mpsc::channel();
        let nested = std::thread::spawn(move || {
            let _outer = section();
            let _inner = section_waiting();
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "a section nested in another waited for the fork that waits for it"
        );
        nested.join().unwrap();
        drop(s);
        assert!(!in_section());
        wait_idle();
        end_fork();
        t.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(in_flight(), base);

        // A forked child is a new generation with nothing of other threads in flight.
        let before = generation();
        let _s = section();
        // The child answers through a pipe (its exit status is not the answer: under
        // valgrind a child's exit reports its leaks and changes the status).
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads atomics, writes one byte and calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // Only the forking thread's own section (`_s`) is counted in the child.
            let ok = generation() == before + 1 && in_flight() == 1 && !others_in_flight();
            let answer = if ok { b'Y' } else { b'N' };
            // SAFETY: fds[1] is the pipe's write end; one byte from a live local.
            unsafe {
                libc::write(fds[1], (&raw const answer).cast(), 1);
                libc::_exit(0);
            }
        }
        let mut answer = 0u8;
        // SAFETY: fds[0] is the pipe's read end; one byte into a live local; then the
        // child is reaped.
        unsafe {
            libc::close(fds[1]);
            libc::read(fds[0], (&raw mut answer).cast(), 1);
            libc::close(fds[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(
            answer, b'Y',
            "the child saw the parent's generation or sections"
        );
        assert_eq!(generation(), before);
    }
}
