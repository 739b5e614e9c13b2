//! How a device spills ([`SpillSettings`]) and what the environment asks for
//! (`MEMARRAY_SPILL` and its budgets), parsed apart from the spilling itself.

use std::path::PathBuf;

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

/// Parses a byte count: digits with an optional unit (`B`, `KB`/`MB`/`GB`/`TB` in powers
/// of 1000, `KiB`/`MiB`/`GiB`/`TiB` in powers of 1024), spaces and case ignored.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let not_a_count = || format!("{s:?} is not a byte count (for example 4GiB or 4000000000)");
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "tb" | "t" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    let out_of_range = || format!("{s:?} is out of range: a byte count is below 2**64");
    // Exact integer arithmetic (a float would round 2**64 - 1 up to 2**64 and take it).
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(not_a_count());
    }
    let digits = |d: &str| -> std::result::Result<u128, String> {
        if d.is_empty() {
            return Ok(0);
        }
        if d.len() > 30 {
            return Err(out_of_range());
        }
        d.parse::<u128>().map_err(|_| not_a_count())
    };
    let scale = 10u128
        .checked_pow(u32::try_from(frac.len()).map_err(|_| not_a_count())?)
        .filter(|_| frac.len() <= 30)
        .ok_or_else(out_of_range)?;
    let (whole, frac) = (digits(whole)?, digits(frac)?);
    let scaled = whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(frac))
        .and_then(|v| v.checked_mul(u128::from(mult)))
        .ok_or_else(out_of_range)?;
    if scaled % scale != 0 {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    u64::try_from(scaled / scale).map_err(|_| out_of_range())
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
    let devices: Vec<u32> = match which.as_str() {
        "0" | "off" | "no" | "false" => return Ok(None),
        "1" | "on" | "all" | "yes" | "true" => {
            (0..crate::device_count().unwrap_or(0) as u32).collect()
        }
        list => list
            .split(',')
            .map(|d| {
                d.trim()
                    .strip_prefix("cuda:")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| {
                        format!(
                            "MEMARRAY_SPILL={which:?}: expected 1, all, off or devices like cuda:0,cuda:1"
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
