//! Reading memarray's environment variables: one rule for every variable. An unset
//! variable is `None`; a value that is not UTF-8 is an error naming the variable (never
//! silently taken as unset, while ASCII garbage in the same variable is refused); byte
//! counts ([`parse_bytes`]) are read one way everywhere.

use std::env::VarError;

use crate::error::SettingError;

/// `name`'s value, `None` when unset.
///
/// # Errors
/// [`SettingError::Env`] when the value is not UTF-8 (shown lossily, with the bytes
/// UTF-8 cannot hold replaced).
pub fn var(name: &'static str) -> Result<Option<String>, SettingError> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(raw)) => Err(SettingError::Env {
            var: name,
            value: raw.to_string_lossy().into_owned(),
            expected: "UTF-8 text",
        }),
    }
}

/// `name`'s on/off value ([`memarray_core::env`]'s words): `None` when unset or empty.
///
/// # Errors
/// [`SettingError::Env`] for any other value, or one that is not UTF-8.
pub fn switch(name: &'static str) -> Result<Option<bool>, SettingError> {
    switch_of(name, var(name)?.as_deref())
}

/// [`switch`] of a value already read.
///
/// # Errors
/// As [`switch`].
pub fn switch_of(name: &'static str, value: Option<&str>) -> Result<Option<bool>, SettingError> {
    let Some(v) = value else { return Ok(None) };
    memarray_core::env::parse_switch(v).map_err(|_| SettingError::Env {
        var: name,
        value: v.to_string(),
        expected: memarray_core::env::EXPECTED,
    })
}

/// `name`'s byte count ([`parse_bytes`]): `None` when unset or empty.
///
/// # Errors
/// [`SettingError::Env`] for a value that is not a byte count, or not UTF-8.
pub fn bytes(name: &'static str) -> Result<Option<u64>, SettingError> {
    bytes_of(name, var(name)?.as_deref())
}

/// [`bytes`] of a value already read.
///
/// # Errors
/// As [`bytes`].
pub fn bytes_of(name: &'static str, value: Option<&str>) -> Result<Option<u64>, SettingError> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    parse_bytes(v).map(Some).map_err(|_| SettingError::Env {
        var: name,
        value: v.to_string(),
        expected: "a byte count (for example 64KiB, 4GiB or 4000000000)",
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_is_not_utf8_is_an_error_naming_the_variable() {
        use std::os::unix::ffi::OsStrExt;
        // A name no other test reads.
        const NAME: &str = "MEMARRAY_TEST_ENV_NOT_UTF8";
        // SAFETY: this test alone uses the variable; no other thread reads it.
        unsafe { std::env::set_var(NAME, std::ffi::OsStr::from_bytes(b"\xff\xfe")) };
        let e = var(NAME).unwrap_err();
        assert!(
            e.to_string().contains(NAME) && e.to_string().contains("UTF-8"),
            "{e}"
        );
        // SAFETY: as above.
        unsafe { std::env::set_var(NAME, "4GiB") };
        assert_eq!(var(NAME).unwrap().as_deref(), Some("4GiB"));
        // SAFETY: as above.
        unsafe { std::env::remove_var(NAME) };
        assert_eq!(var(NAME).unwrap(), None);
    }
}
