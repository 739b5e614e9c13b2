//! [`Source`]: which library an allocation is for, so one resource stack serving torch,
//! CuPy, Numba, RMM, cuda.core and memarray itself can say who holds what.
//!
//! The glue that lets a library allocate through memarray runs each call inside
//! [`with_source`]; adaptors that attribute memory ([`TrackingAdaptor`],
//! [`StatisticsAdaptor`]) read [`current_source`]. Outside any glue the source is
//! [`Source::Memarray`].
//!
//! [`TrackingAdaptor`]: super::TrackingAdaptor
//! [`StatisticsAdaptor`]: super::StatisticsAdaptor

use std::cell::Cell;
use std::fmt;

use crate::error::CoreError;

/// A library that allocates through memarray. The set is closed: every name a user can
/// give is one of these, so a typo is an error, not a new row in the statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// memarray's own arrays and direct resource calls.
    Memarray,
    /// PyTorch, through `memarray.torch`.
    Torch,
    /// CuPy, through `memarray.cupy`.
    Cupy,
    /// Numba, through `memarray.numba`.
    Numba,
    /// RMM (and cuDF, cuML ... on it), through `memarray.rmm`.
    Rmm,
    /// cuda.core, through `memarray.cuda_core`.
    CudaCore,
}

impl Source {
    /// Every source, in index order.
    pub const ALL: [Source; 6] = [
        Source::Memarray,
        Source::Torch,
        Source::Cupy,
        Source::Numba,
        Source::Rmm,
        Source::CudaCore,
    ];

    /// The lower-case name (`"torch"`).
    pub fn name(self) -> &'static str {
        match self {
            Source::Memarray => "memarray",
            Source::Torch => "torch",
            Source::Cupy => "cupy",
            Source::Numba => "numba",
            Source::Rmm => "rmm",
            Source::CudaCore => "cuda_core",
        }
    }

    /// A dense index, `0..ALL.len()`, for per-source counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The source named `name` (exactly as [`Source::name`] writes it);
    /// [`CoreError::UnknownSource`] otherwise.
    pub fn parse(name: &str) -> Result<Source, CoreError> {
        Source::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| CoreError::UnknownSource {
                name: name.chars().take(80).collect(),
            })
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

thread_local! {
    static CURRENT: Cell<Option<Source>> = const { Cell::new(None) };
}

/// Runs `f` with `source` as this thread's [`current_source`] (nesting restores the outer
/// one, also when `f` panics).
pub fn with_source<R>(source: Source, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Source>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(source))));
    f()
}

/// The source of the allocation this thread is making: the innermost [`with_source`], or
/// `None` outside one (memarray's own).
pub fn current_source() -> Option<Source> {
    CURRENT.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for s in Source::ALL {
            assert_eq!(Source::parse(s.name()).unwrap(), s);
            assert_eq!(Source::ALL[s.index()], s);
        }
        let e = Source::parse("Torch").unwrap_err();
        assert!(
            e.to_string().contains("Torch") && e.to_string().contains("cupy"),
            "{e}"
        );
    }

    #[test]
    fn with_source_nests_and_restores() {
        assert_eq!(current_source(), None);
        with_source(Source::Torch, || {
            assert_eq!(current_source(), Some(Source::Torch));
            with_source(Source::Rmm, || {
                assert_eq!(current_source(), Some(Source::Rmm))
            });
            assert_eq!(current_source(), Some(Source::Torch));
            let r = std::panic::catch_unwind(|| with_source(Source::Cupy, || panic!("x")));
            assert!(r.is_err());
            assert_eq!(current_source(), Some(Source::Torch));
        });
        assert_eq!(current_source(), None);
    }
}
