//! Reading memarray's environment variables: one rule for every variable. An unset
//! variable is `None`; a value that is not UTF-8 is an error naming the variable (never
//! silently taken as unset, while ASCII garbage in the same variable is refused).

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
