//! The words memarray's on/off environment switches take: one list for every variable and
//! every front end (`MEMARRAY_NVTX` here, the rest through memarray-cuda's `env::switch`
//! and Python's `memarray._env`), so `off` never means on in one place and off in another.

/// Words that turn a switch on (case and surrounding spaces ignored).
pub const ON: [&str; 4] = ["1", "on", "true", "yes"];
/// Words that turn a switch off (case and surrounding spaces ignored).
pub const OFF: [&str; 4] = ["0", "off", "false", "no"];
/// What a switch takes, for error messages.
pub const EXPECTED: &str = "1, on, true or yes; 0, off, false or no; or empty for the default";

/// A switch's value: `Ok(Some(true))` for an [`ON`] word, `Ok(Some(false))` for an
/// [`OFF`] word, `Ok(None)` for empty or spaces (the default).
///
/// # Errors
/// Any other value, returned as the value itself (the caller names the variable).
pub fn parse_switch(value: &str) -> Result<Option<bool>, &str> {
    let word = value.trim().to_ascii_lowercase();
    if word.is_empty() {
        Ok(None)
    } else if ON.contains(&word.as_str()) {
        Ok(Some(true))
    } else if OFF.contains(&word.as_str()) {
        Ok(Some(false))
    } else {
        Err(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_reads_one_way_and_anything_else_is_refused() {
        for w in ["1", "on", "TRUE", " yes "] {
            assert_eq!(parse_switch(w), Ok(Some(true)), "{w}");
        }
        for w in ["0", "Off", "false", "NO"] {
            assert_eq!(parse_switch(w), Ok(Some(false)), "{w}");
        }
        assert_eq!(parse_switch(""), Ok(None));
        assert_eq!(parse_switch("  "), Ok(None));
        for w in ["2", "garbage", "o n", "enabled", "-1"] {
            assert_eq!(parse_switch(w), Err(w));
        }
    }
}
