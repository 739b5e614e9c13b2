//! include/memarray.h is what cbindgen makes of src/ now. After changing the ABI, run
//! `MEMARRAY_BLESS=1 cargo test -p memarray-c --test header` and commit the header.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads src/")
        .write(&mut generated);
    let generated = for_c(&String::from_utf8(generated).expect("cbindgen writes UTF-8"));
    assert!(
        !generated.contains("[`") && !generated.contains("`]"),
        "rustdoc link syntax left in the header"
    );
    let path = dir.join("include/memarray.h");
    if std::env::var_os("MEMARRAY_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/memarray.h");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/memarray.h is stale: run MEMARRAY_BLESS=1 cargo test -p memarray-c --test \
         header and commit it"
    );
}

/// The doc comments as a C reader sees them: rustdoc's intra-doc links (`[`name`]`) are
/// plain code spans in C.
fn for_c(header: &str) -> String {
    header.replace("[`", "`").replace("`]", "`")
}
