// Raises torch's out-of-memory error for memarray's torch allocator (src/interop.rs).
//
// torch's pluggable allocator does not check the pointer its allocation function returns,
// so an allocation that cannot be met must throw: torch turns a C++ exception into a
// Python RuntimeError carrying its message. Rust cannot throw one, so this function does;
// Rust calls it through the "C-unwind" ABI, which lets the exception pass its frames.

#include <stdexcept>

extern "C" [[noreturn]] void memarray_throw_out_of_memory(const char* message) {
    throw std::runtime_error(message);
}
