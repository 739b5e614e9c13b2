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

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static FORKING: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // The child has one thread, the one that forked: nothing of the parent's is in flight.
    IN_FLIGHT.store(0, Ordering::SeqCst);
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
/// docs). Sections nest.
#[must_use = "the section ends when this is dropped"]
#[derive(Debug)]
pub struct Section(());

impl Drop for Section {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters a section from a thread that holds the host language's lock (Python's GIL, held
/// by the thread that forks): never waits.
pub fn section() -> Section {
    install();
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    Section(())
}

/// Enters a section from a thread that may run while a fork is being prepared (a foreign
/// allocator's callback, a C caller): waits until the fork is done. Call it before taking
/// any lock.
pub fn section_waiting() -> Section {
    install();
    loop {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        // SeqCst on both sides: either the forking thread sees this count, or this thread
        // sees its flag.
        if !FORKING.load(Ordering::SeqCst) {
            return Section(());
        }
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
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

/// Marks a fork as being prepared: [`section_waiting`] waits from now until [`end_fork`].
pub fn begin_fork() {
    install();
    FORKING.store(true, Ordering::SeqCst);
}

/// Waits (sleeping) until no section is in flight. Call it without the host language's
/// lock, after [`begin_fork`].
pub fn wait_idle() {
    let mut spins = 0u32;
    while in_flight() > 0 {
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
        // A section of a thread holding the host lock is never held back.
        let s = section();
        assert_eq!(in_flight(), base + 1);
        drop(s);
        wait_idle();
        end_fork();
        t.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(in_flight(), base);

        // A forked child is a new generation with nothing in flight.
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
            let ok = generation() == before + 1 && in_flight() == 0;
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
