//! Fork safety for Python (see `memarray_core::fork`). Every GIL release goes through
//! [`Detach::detach_section`], so memarray's locks are held with the GIL released only inside
//! a counted section (each caller takes its locks inside the closure it detaches, never
//! across the call); `os.register_at_fork(before=...)` waits, with the GIL released, until
//! no section is in flight, and the fork then happens with the GIL held, so no other thread
//! can be inside one. Locks taken with the GIL held are released before the GIL is (the
//! style rule: no Rust lock across a call into Python), so none of them crosses a fork
//! either. Once-cells whose initialiser runs Python code (which may release the GIL) are
//! filled through `crate::once::once`, which runs the code outside the cell.

use pyo3::prelude::*;

use memarray_core::fork;

/// `py.detach`, counted as a fork section.
pub trait Detach {
    /// Runs `f` with the GIL released inside a fork section.
    fn detach_section<T, F>(self, f: F) -> T
    where
        F: Send + FnOnce() -> T,
        T: Send;
}

impl Detach for Python<'_> {
    fn detach_section<T, F>(self, f: F) -> T
    where
        F: Send + FnOnce() -> T,
        T: Send,
    {
        // No memarray lock is held here (every caller takes its locks inside `f`): while a
        // fork is prepared, wait for it with the GIL released, else threads that keep
        // starting sections could keep the fork waiting for ever. A thread already inside a
        // section (a producer's deleter calling memarray during an import) goes on: the fork
        // waits for its outer section, which waiting here would never let end.
        if fork::forking() && !fork::in_section() {
            #[allow(clippy::disallowed_methods)]
            self.detach(fork::wait_fork_done);
        }
        // Entered with the GIL held: counted before the forking thread's last check. The
        // section ends inside the closure, before the GIL is taken again: a thread done with
        // its work does not keep the forking thread (which holds the GIL) waiting.
        let section = fork::section();
        #[allow(clippy::disallowed_methods)]
        self.detach(move || {
            let _section = section;
            f()
        })
    }
}

/// `os.register_at_fork(before=...)`: waits, with the GIL released, until no section is in
/// flight, then returns with the GIL held (so no new one can start before the fork).
#[pyfunction]
fn _before_fork(py: Python<'_>) {
    // Best effort: a failure here leaves the child to fill them.
    let _ = crate::dtype::fill_tables(py);
    fork::begin_fork();
    while fork::others_in_flight() {
        #[allow(clippy::disallowed_methods)]
        py.detach(fork::wait_idle);
    }
}

/// `os.register_at_fork(after_in_parent=..., after_in_child=...)`.
#[pyfunction]
fn _after_fork() {
    fork::end_fork();
}

/// Registers the fork hooks with `os.register_at_fork`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let before = wrap_pyfunction!(_before_fork, m)?;
    let after = wrap_pyfunction!(_after_fork, m)?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("before", before)?;
    kwargs.set_item("after_in_parent", &after)?;
    kwargs.set_item("after_in_child", &after)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}

/// A section for a callback a foreign library makes on any thread (torch's allocator):
/// one that holds the GIL never waits (the forking thread would wait for it), others wait
/// while a fork is being prepared.
pub fn foreign_section() -> fork::Section {
    if crate::gil::held() {
        fork::section()
    } else {
        fork::section_waiting()
    }
}
