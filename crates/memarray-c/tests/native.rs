//! Compiles `tests/native/test_c.c` (against the shared and the static library) and
//! `tests/native/test_cpp.cpp` with the system's cc / c++ and runs them; each exits
//! non-zero on its first failed check. `MEMARRAY_NATIVE_VALGRIND=1` runs them under
//! valgrind memcheck, failing on any error or definite leak (scripts/valgrind.sh).
//! On the GPU machine (no Rust there) the staged binary finds the sources through
//! `MEMARRAY_REPO_ROOT` and the libraries through `MEMARRAY_C_LIB_DIR`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    match std::env::var_os("MEMARRAY_REPO_ROOT") {
        Some(root) => Path::new(&root).join("crates/memarray-c"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// Where libmemarray.{so,a} are: MEMARRAY_C_LIB_DIR, else this test's own directory
/// (target/<profile>/deps: `cargo test` builds the library's cdylib and staticlib there
/// for this test, so a fresh clone's plain `cargo test` needs nothing built first), else
/// target/<profile> (`cargo build -p memarray-c`).
fn lib_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMARRAY_C_LIB_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    if deps.join("libmemarray.so").exists() && deps.join("libmemarray.a").exists() {
        return deps;
    }
    deps.parent().expect("target/<profile>").to_path_buf()
}

fn compile(compiler: &str, source: &str, out: &str, extra: &[&str], link_static: bool) -> PathBuf {
    let lib = lib_dir();
    let wanted = lib.join(if link_static {
        "libmemarray.a"
    } else {
        "libmemarray.so"
    });
    assert!(
        wanted.exists(),
        "{} is missing: `cargo test -p memarray-c` or `cargo build -p memarray-c` makes it",
        wanted.display()
    );
    let exe = std::env::temp_dir().join(format!("memarray-{}-{out}", std::process::id()));
    let include = crate_dir().join("include");
    let indexer = crate_dir().join("../../kernels-cuda/include");
    let mut cmd = Command::new(compiler);
    cmd.args(extra)
        .arg("-Wall")
        .arg("-Wextra")
        .arg("-Werror")
        .arg("-g")
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", indexer.display()))
        .arg(if source.starts_with("examples/") {
            crate_dir().join("../..").join(source)
        } else {
            crate_dir().join("tests/native").join(source)
        })
        .arg("-o")
        .arg(&exe);
    if link_static {
        cmd.arg(lib.join("libmemarray.a"))
            .args(["-lpthread", "-ldl", "-lm"]);
    } else {
        cmd.arg(format!("-L{}", lib.display()))
            .arg("-lmemarray")
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    let r = cmd
        .output()
        .unwrap_or_else(|e| panic!("{compiler} did not start: {e}"));
    assert!(
        r.status.success(),
        "{compiler} {source} failed:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    exe
}

fn run(exe: &Path) {
    run_with(exe, &[], true);
}

fn run_with(exe: &Path, env: &[(&str, &str)], valgrind_allowed: bool) {
    let valgrind =
        valgrind_allowed && std::env::var("MEMARRAY_NATIVE_VALGRIND").is_ok_and(|v| v == "1");
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "--tool=memcheck",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ])
        .arg(format!(
            "--suppressions={}",
            crate_dir().join("../../scripts/valgrind.supp").display()
        ))
        .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    cmd.envs(env.iter().copied());
    cmd.env(
        "MEMARRAY_TEST_PTX",
        crate_dir().join("../memarray-seed/src/ptx/add_index_f32.ptx"),
    );
    let r = cmd.output().expect("the test program starts");
    let stdout = String::from_utf8_lossy(&r.stdout);
    let stderr = String::from_utf8_lossy(&r.stderr);
    let _ = std::fs::remove_file(exe);
    println!("{stdout}");
    if valgrind {
        let summary = stderr
            .lines()
            .filter(|l| l.contains("ERROR SUMMARY"))
            .collect::<Vec<_>>()
            .join("\n");
        println!("{}: {summary}", exe.display());
    }
    assert!(
        r.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        exe.display(),
        r.status,
        &stderr[stderr.len().saturating_sub(4000)..]
    );
}

#[test]
fn the_c_tests_pass_against_the_shared_library() {
    run(&compile(
        "cc",
        "test_c.c",
        "test_c_shared",
        &["-std=c11"],
        false,
    ));
}

#[test]
fn the_c_tests_pass_against_the_static_library() {
    if !lib_dir().join("libmemarray.a").exists() && std::env::var_os("MEMARRAY_C_LIB_DIR").is_some()
    {
        // The GPU machine gets the shared library only (the static one is too big to
        // carry); CI links the static one.
        println!("SKIPPED: no libmemarray.a in MEMARRAY_C_LIB_DIR");
        return;
    }
    run(&compile(
        "cc",
        "test_c.c",
        "test_c_static",
        &["-std=c11"],
        true,
    ));
}

#[test]
fn the_c_tests_pass_under_address_and_undefined_behaviour_sanitizers() {
    // The C side instrumented (the Rust library is not: its own checks run under valgrind).
    // LSan is off: the library's process-wide caches live until exit by design.
    let exe = compile(
        "cc",
        "test_c.c",
        "test_c_asan",
        &[
            "-std=c11",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ],
        false,
    );
    // ASan and valgrind do not run together: this binary always runs bare.
    run_with(
        &exe,
        &[("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")],
        false,
    );
}

#[test]
fn the_cpp_tests_pass() {
    run(&compile(
        "c++",
        "test_cpp.cpp",
        "test_cpp",
        &["-std=c++17", "-pthread"],
        false,
    ));
}

#[test]
fn the_c_example_runs() {
    run(&compile(
        "cc",
        "examples/c/saxpy.c",
        "saxpy",
        &["-std=c11"],
        false,
    ));
}
