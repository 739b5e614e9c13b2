//! How a device spills ([`SpillSettings`]) and what the environment asks for
//! (`MEMARRAY_SPILL` and its budgets), parsed apart from the spilling itself.

use std::path::PathBuf;

use crate::env::parse_bytes;

/// How one device spills.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpillSettings {
    /// Keep memarray's spillable arrays on the device within this many bytes (spill
    /// before an allocation would pass it). `None`: spill only when an allocation fails.
    pub device_budget: Option<u64>,
    /// Host bytes that spilling may allocate for host copies (arrays made on the device
    /// have none until they spill). Beyond it, host copies come from a file in
    /// `file_dir`; without one, spilling stops there. `None`: no limit.
    pub host_budget: Option<u64>,
    /// Directory for the file tier (a file per device, unlinked at once, so it goes
    /// away with the process).
    pub file_dir: Option<PathBuf>,
}

/// The devices and settings the environment asks for: `MEMARRAY_SPILL` (`1`, `on` or
/// `all`: every device; `cuda:0,cuda:2`: those; unset, empty, `0` or `off`: none),
/// `MEMARRAY_DEVICE_BUDGET`, `MEMARRAY_HOST_BUDGET` (byte counts, [`parse_bytes`]) and
/// `MEMARRAY_SPILL_DIR`.
pub fn env_settings() -> std::result::Result<Option<(Vec<u32>, SpillSettings)>, String> {
    let var = |k: &'static str| -> std::result::Result<Option<String>, String> {
        Ok(crate::env::var(k)
            .map_err(|e| e.to_string())?
            .filter(|v| !v.trim().is_empty()))
    };
    let bytes = |k: &'static str| -> std::result::Result<Option<u64>, String> {
        var(k)?
            .map(|v| parse_bytes(&v).map_err(|e| format!("{k}: {e}")))
            .transpose()
    };
    // Budgets are checked whether or not spilling is asked for: a bad value is an error
    // either way, never silently ignored.
    let device_budget = bytes("MEMARRAY_DEVICE_BUDGET")?;
    let host_budget = bytes("MEMARRAY_HOST_BUDGET")?;
    // A directory is a path: any bytes (not only UTF-8) name one.
    let file_dir = std::env::var_os("MEMARRAY_SPILL_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let Some(which) = var("MEMARRAY_SPILL")? else {
        return Ok(None);
    };
    let which = which.trim().to_ascii_lowercase();
    let devices: Vec<u32> = match (memarray_core::env::parse_switch(&which), which.as_str()) {
        (Ok(Some(false)), _) => return Ok(None),
        (Ok(Some(true)), _) | (_, "all") => {
            (0..crate::device_count().unwrap_or(0) as u32).collect()
        }
        (_, list) => list
            .split(',')
            .map(|d| {
                d.trim()
                    .strip_prefix("cuda:")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| {
                        format!(
                            "MEMARRAY_SPILL={which:?}: expected an on word (1, on, true, yes) or all, an off word (0, off, false, no), or devices like cuda:0,cuda:1"
                        )
                    })
            })
            .collect::<std::result::Result<_, _>>()?,
    };
    Ok(Some((
        devices,
        SpillSettings {
            device_budget,
            host_budget,
            file_dir,
        },
    )))
}
