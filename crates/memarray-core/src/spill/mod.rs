//! Spilling's device-independent half: the victim policy
//! ([`SpillPolicy`]) and the byte bookkeeping against a budget ([`SpillRegistry`]).
//! memarray-cuda's `spill` module moves the data; everything here is tested on the CPU
//! against a fake device resource.

mod policy;
mod registry;

pub use policy::{Expert, SpillPolicy};
pub use registry::{SpillOutcome, SpillRegistry, SpillStatistics, Spiller};
