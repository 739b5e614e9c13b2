//! Compiles the one C++ function the torch allocator needs (src/torch_oom.cpp).

fn main() {
    println!("cargo:rerun-if-changed=src/torch_oom.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/torch_oom.cpp")
        .flag_if_supported("-std=c++17")
        .compile("memarray_torch_oom");
}
