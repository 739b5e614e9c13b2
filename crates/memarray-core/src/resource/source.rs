//! [`Source`]: which library an allocation is for, so one resource stack serving several
//! libraries and memarray itself can say who holds what.
//!
//! The set is open but registered: memarray-core names no library. A front end registers
//! each library it lets allocate through memarray ([`Source::register`]: the Python
//! bindings register torch, cupy, numba, rmm and cuda_core when they load), and every
//! name a user can give must be registered, so a typo is an error, not a new row in the
//! statistics. [`Source::MEMARRAY`] is always there.
//!
//! The glue that lets a library allocate through memarray runs each call inside
//! [`with_source`]; adaptors that attribute memory ([`TrackingAdaptor`],
//! [`StatisticsAdaptor`]) read [`current_source`]. Outside any glue the source is
//! [`Source::MEMARRAY`].
//!
//! [`TrackingAdaptor`]: super::TrackingAdaptor
//! [`StatisticsAdaptor`]: super::StatisticsAdaptor

use std::cell::Cell;
use std::fmt;
use std::sync::{PoisonError, RwLock};

use crate::error::CoreError;

/// A library that allocates through memarray: a registered name, cheap to copy and to
/// compare; [`Source::index`] is dense (`0..Source::MAX`) for per-source counters. The
/// default is [`Source::MEMARRAY`] (an allocation outside any library's glue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source(u8);

/// The registered names, in index order (index 0: memarray).
static NAMES: RwLock<Vec<&'static str>> = RwLock::new(Vec::new());

fn names() -> std::sync::RwLockReadGuard<'static, Vec<&'static str>> {
    NAMES.read().unwrap_or_else(PoisonError::into_inner)
}

impl Source {
    /// memarray's own arrays and direct resource calls.
    pub const MEMARRAY: Source = Source(0);

    /// Most sources a process can register, memarray included (the per-source counters
    /// are arrays of this size).
    pub const MAX: usize = 8;

    /// The source named `name`, registered now if it was not (the same name always gives
    /// the same source). Names are lower-case ASCII letters, digits and `_`.
    ///
    /// # Errors
    /// [`CoreError::UnknownSource`] for a name that is not of that form, or when
    /// [`Source::MAX`] sources are registered already.
    pub fn register(name: &'static str) -> Result<Source, CoreError> {
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(CoreError::UnknownSource {
                name: name.chars().take(80).collect(),
                known: Self::known(),
            });
        }
        if let Ok(s) = Source::parse(name) {
            return Ok(s);
        }
        register_in(
            &mut NAMES.write().unwrap_or_else(PoisonError::into_inner),
            name,
        )
    }

    /// Every registered source, in index order ([`Source::MEMARRAY`] first).
    pub fn all() -> Vec<Source> {
        let n = names().len().max(1);
        (0..n).map(|i| Source(i as u8)).collect()
    }

    /// The name it was registered with (`"torch"`).
    pub fn name(self) -> &'static str {
        if self == Source::MEMARRAY {
            return "memarray";
        }
        names().get(self.index()).copied().unwrap_or("memarray")
    }

    /// A dense index, `0..Source::MAX`, for per-source counters.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The registered source named `name` (exactly as [`Source::name`] writes it);
    /// [`CoreError::UnknownSource`], naming the registered ones, otherwise.
    pub fn parse(name: &str) -> Result<Source, CoreError> {
        if name == "memarray" {
            return Ok(Source::MEMARRAY);
        }
        names()
            .iter()
            .position(|n| *n == name)
            .map(|i| Source(i as u8))
            .ok_or_else(|| CoreError::UnknownSource {
                name: name.chars().take(80).collect(),
                known: Self::known(),
            })
    }

    /// The registered names, for messages.
    fn known() -> String {
        let all = names();
        if all.is_empty() {
            "memarray".into()
        } else {
            all.join(", ")
        }
    }
}

/// Registers `name` in `all` (the registry, or a test's own list).
fn register_in(all: &mut Vec<&'static str>, name: &'static str) -> Result<Source, CoreError> {
    if all.is_empty() {
        all.push("memarray");
    }
    if let Some(i) = all.iter().position(|n| *n == name) {
        return Ok(Source(i as u8)); // registered by another thread meanwhile
    }
    if all.len() >= Source::MAX {
        return Err(CoreError::UnknownSource {
            name: name.into(),
            known: format!(
                "{} (no room for more: {} at most)",
                all.join(", "),
                Source::MAX
            ),
        });
    }
    all.push(name);
    Ok(Source((all.len() - 1) as u8))
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
    fn registered_names_round_trip_and_others_are_errors() {
        let torch = Source::register("torch").unwrap();
        let cupy = Source::register("cupy").unwrap();
        assert_eq!(
            Source::register("torch").unwrap(),
            torch,
            "registering is idempotent"
        );
        assert_ne!(torch, cupy);
        for s in Source::all() {
            assert_eq!(Source::parse(s.name()).unwrap(), s);
            assert_eq!(Source::all()[s.index()], s);
        }
        assert_eq!(Source::all()[0], Source::MEMARRAY);
        assert_eq!(Source::MEMARRAY.name(), "memarray");
        let e = Source::parse("Torch").unwrap_err();
        assert!(
            e.to_string().contains("Torch") && e.to_string().contains("cupy"),
            "{e}"
        );
        assert!(Source::register("Not A Name").is_err());
        assert!(Source::register("").is_err());
    }

    #[test]
    fn the_registry_is_bounded() {
        // On a list of its own: the process's registry is shared with the other tests.
        let mut all = Vec::new();
        let names = ["a0", "a1", "a2", "a3", "a4", "a5", "a6"];
        for (i, name) in names.into_iter().enumerate() {
            assert_eq!(register_in(&mut all, name).unwrap().index(), i + 1);
        }
        assert_eq!(all.len(), Source::MAX);
        assert_eq!(
            register_in(&mut all, "a3").unwrap().index(),
            4,
            "known names still resolve"
        );
        let e = register_in(&mut all, "one_too_many").unwrap_err();
        assert!(e.to_string().contains("no room"), "{e}");
    }

    #[test]
    fn with_source_nests_and_restores() {
        assert_eq!(current_source(), None);
        let (torch, rmm, cupy) = (
            Source::register("torch").unwrap(),
            Source::register("rmm").unwrap(),
            Source::register("cupy").unwrap(),
        );
        with_source(torch, || {
            assert_eq!(current_source(), Some(torch));
            with_source(rmm, || assert_eq!(current_source(), Some(rmm)));
            assert_eq!(current_source(), Some(torch));
            let r = std::panic::catch_unwind(|| with_source(cupy, || panic!("x")));
            assert!(r.is_err());
            assert_eq!(current_source(), Some(torch));
        });
        assert_eq!(current_source(), None);
    }
}
