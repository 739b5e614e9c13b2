//! The committed PTX (memarray-seed's `src/ptx/`, this crate's `src/copy/ptx/`) is what
//! `kernels-cuda/build.sh`
//! makes from the committed sources.
//! Needs the pinned nvcc (13.0.88) on PATH, in /usr/local/cuda/bin, in `$NVCC` or in
//! ./.venv-nvcc; otherwise prints `SKIPPED: ...` and passes. Comment lines (`//`, which
//! carry the compiler's build id) are ignored.

use std::path::{Path, PathBuf};
use std::process::Command;

use memarray_testing::gpu::report_skip;

fn code_lines(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect()
}

#[test]
fn committed_ptx_matches_a_fresh_build() {
    // Test binaries may run on another machine: $MEMARRAY_REPO_ROOT names the checkout.
    let root = std::env::var_os("MEMARRAY_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    if !root.join("kernels-cuda/build.sh").exists() {
        return report_skip(&format!(
            "{}/kernels-cuda/build.sh not found (set MEMARRAY_REPO_ROOT); PTX not rebuilt",
            root.display()
        ));
    }
    let out = std::env::temp_dir().join(format!("memarray_ptx_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let copy_out = out.join("copy");
    let run = Command::new("bash")
        .arg(root.join("kernels-cuda/build.sh"))
        .arg(&out)
        .arg(&copy_out)
        .env("MEMARRAY_NVCC_NO_INSTALL", "1")
        .output();
    let run = match run {
        Ok(r) => r,
        Err(e) => return report_skip(&format!("cannot run bash ({e}); PTX not rebuilt")),
    };
    let stderr = String::from_utf8_lossy(&run.stderr);
    if run.status.code() == Some(3) {
        return report_skip(&format!("{}; committed PTX not compared", stderr.trim()));
    }
    assert!(
        run.status.success(),
        "kernels-cuda/build.sh failed:\n{stderr}"
    );
    let mut compared = 0;
    for (fresh_dir, committed) in [
        (&out, "crates/memarray-seed/src/ptx"),
        (&copy_out, "crates/memarray-cuda/src/copy/ptx"),
    ] {
        let committed_dir = root.join(committed);
        for entry in std::fs::read_dir(fresh_dir).unwrap() {
            let fresh_path = entry.unwrap().path();
            if fresh_path.is_dir() {
                continue;
            }
            let name = fresh_path.file_name().unwrap();
            let fresh = std::fs::read_to_string(&fresh_path).unwrap();
            let committed_text = std::fs::read_to_string(committed_dir.join(name))
                .unwrap_or_else(|e| panic!("{name:?} is built but not committed: {e}"));
            let (a, b) = (code_lines(&committed_text), code_lines(&fresh));
            if let Some(k) = (0..a.len().max(b.len())).find(|&k| a.get(k) != b.get(k)) {
                panic!(
                    "{committed}/{} is stale at code line {k}: \
                     committed {:?}, fresh {:?}; run kernels-cuda/build.sh",
                    name.to_string_lossy(),
                    a.get(k),
                    b.get(k)
                );
            }
            compared += 1;
        }
    }
    assert!(compared > 0, "build.sh produced no PTX");
    let _ = std::fs::remove_dir_all(&out);
}
