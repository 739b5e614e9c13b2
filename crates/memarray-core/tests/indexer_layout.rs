//! `kernels-cuda/include/memarray/indexer.cuh` mirrors [`memarray_core::Indexer`] field for
//! field: kernels receive the Rust struct by value. This test compiles a small C++ program
//! against the header with the host C++ compiler (`$CXX`, else `c++`) and compares
//! `sizeof`, `offsetof`, `len()`, `unravel()` and `offset()` with the Rust side.
//! Without a C++ compiler it prints `SKIPPED: ...` (stderr, uncaptured) and passes.

use std::fmt::Write as _;
use std::io::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use memarray_core::Indexer;

/// `kernels-cuda/include`: under `$MEMARRAY_REPO_ROOT` if set (test binaries run on
/// another machine), else where this crate was built from.
fn header_dir() -> PathBuf {
    let root = std::env::var_os("MEMARRAY_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    root.join("kernels-cuda/include")
}

fn skip(reason: &str) {
    let line = format!("SKIPPED: {reason}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// One case: the C++ that runs it, and the output the Rust indexer predicts.
struct Cases {
    cpp: String,
    expected: String,
}

impl Cases {
    fn layout<const N: usize>(&mut self) {
        let shape_off = if N == 0 {
            "0".to_string()
        } else {
            format!("offsetof(Indexer<{N}>, shape)")
        };
        writeln!(
            self.cpp,
            "    std::printf(\"layout {N} %zu %zu %zu\\n\", sizeof(Indexer<{N}>), \
             offsetof(Indexer<{N}>, data), (size_t){shape_off});"
        )
        .unwrap();
        let rust_shape_off = if N == 0 {
            0
        } else {
            offset_of!(Indexer<N>, shape)
        };
        writeln!(
            self.expected,
            "layout {N} {} {} {rust_shape_off}",
            size_of::<Indexer<N>>(),
            offset_of!(Indexer<N>, data)
        )
        .unwrap();
    }

    fn indexing<const N: usize>(&mut self, shape: [u64; N], linears: &[u64]) {
        let list = |v: &[u64]| {
            v.iter()
                .map(|x| format!("{x}ULL"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let shape_init = if N == 0 {
            String::new()
        } else {
            format!(", {{{}}}", list(&shape))
        };
        writeln!(
            self.cpp,
            "    {{\n        const Indexer<{N}> ix{{nullptr{shape_init}}};\n        \
             const uint64_t linears[] = {{{}}};\n        \
             check<{N}>(ix, linears, {});\n    }}",
            list(linears),
            linears.len()
        )
        .unwrap();
        let ix = Indexer::new(std::ptr::null_mut(), shape);
        writeln!(self.expected, "len {}", ix.len()).unwrap();
        for &l in linears {
            let idx = ix.unravel(l);
            let digits: String = idx.iter().map(|i| format!(" {i}")).collect();
            writeln!(
                self.expected,
                "unravel {l}{digits} offset {}",
                ix.offset(idx)
            )
            .unwrap();
        }
    }
}

const PRELUDE: &str = r#"#include <cstdio>
#include <cstddef>
#include <cstdint>
#include "memarray/indexer.cuh"
using memarray::Indexer;

template <int N>
void check(const Indexer<N>& ix, const uint64_t* linears, int count) {
    std::printf("len %llu\n", (unsigned long long)ix.len());
    for (int k = 0; k < count; ++k) {
        uint64_t idx[N > 0 ? N : 1];
        ix.unravel(linears[k], idx);
        std::printf("unravel %llu", (unsigned long long)linears[k]);
        for (int d = 0; d < N; ++d) std::printf(" %llu", (unsigned long long)idx[d]);
        std::printf(" offset %llu\n", (unsigned long long)ix.offset(idx));
    }
}

int main() {
"#;

fn all(n: u64) -> Vec<u64> {
    (0..n).collect()
}

fn cases() -> Cases {
    let mut c = Cases {
        cpp: PRELUDE.to_string(),
        expected: String::new(),
    };
    c.layout::<0>();
    c.layout::<1>();
    c.layout::<2>();
    c.layout::<3>();
    c.layout::<4>();
    c.layout::<32>();
    c.indexing::<0>([], &[0]);
    c.indexing::<1>([7], &all(7));
    c.indexing::<2>([3, 5], &all(15));
    c.indexing::<3>([2, 3, 4], &all(24));
    c.indexing::<4>([2, 1, 3, 5], &all(30));
    // Around 2^32, where unravel switches from 32-bit to 64-bit division.
    let big = (1u64 << 32) - 1;
    c.indexing::<2>(
        [65536, 65537],
        &[0, big - 1, big, big + 1, big + 2, 65536 * 65537 - 1],
    );
    c.indexing::<2>(
        [3, 5_000_000_000],
        &[0, 4_999_999_999, 5_000_000_000, 14_999_999_999],
    );
    c.indexing::<1>([1 << 40], &[0, big, big + 1, (1 << 40) - 1]);
    // The generic kernel's form: right-aligned in 32 dimensions with leading 1s.
    let mut s32 = [1u64; 32];
    s32[27..].copy_from_slice(&[2, 3, 1, 4, 5]);
    c.indexing::<32>(s32, &all(120));
    c.cpp.push_str("    return 0;\n}\n");
    c
}

#[test]
fn indexer_cuh_matches_the_rust_indexer() {
    let c = cases();
    if !header_dir().join("memarray/indexer.cuh").exists() {
        return skip(&format!(
            "{} not found (set MEMARRAY_REPO_ROOT); indexer.cuh layout not checked",
            header_dir().display()
        ));
    }
    let mut dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("indexer_layout");
    if std::fs::create_dir_all(&dir).is_err() {
        dir = std::env::temp_dir().join(format!("memarray_indexer_layout_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
    }
    let src = dir.join("indexer_layout.cpp");
    let exe = dir.join("indexer_layout");
    std::fs::write(&src, &c.cpp).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let compiled = Command::new(&cxx)
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(header_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let out = match compiled {
        Err(e) => {
            return skip(&format!(
                "no C++ compiler ({cxx}: {e}); indexer.cuh layout not checked"
            ));
        }
        Ok(out) => out,
    };
    assert!(
        out.status.success(),
        "{cxx} failed on indexer.cuh:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let got = String::from_utf8(run.stdout).unwrap();
    for (line, (g, e)) in got.lines().zip(c.expected.lines()).enumerate() {
        assert_eq!(g, e, "line {line} differs: C++ header vs Rust Indexer");
    }
    assert_eq!(got.lines().count(), c.expected.lines().count());
}

#[test]
fn rust_layout_is_pointer_then_u64_shape() {
    assert_eq!(size_of::<Indexer<0>>(), 8);
    assert_eq!(size_of::<Indexer<32>>(), 8 + 32 * 8);
    assert_eq!(offset_of!(Indexer<4>, shape), 8);
    assert_eq!(std::mem::align_of::<Indexer<2>>(), 8);
}
