# memarray tasks. Every target wraps ./dev.sh or a script, so they also run without `just`.

# Build the wheel and run the demo (GPU when there is one).
demo:
    ./dev.sh demo

# Every CPU test: cargo test + pytest.
test:
    ./dev.sh test

# The whole GPU suite on the lent device (build here, run there).
test-gpu:
    ./scripts/test-gpu.sh

# clippy -D warnings, rustfmt --check, ruff.
lint:
    ./dev.sh lint

# API docs.
doc:
    ./dev.sh doc

# Regenerate crates/memarray-seed/src/ptx and crates/memarray-cuda/src/copy/ptx from the .cu sources (needs nvcc 13.0).
kernels:
    ./kernels-cuda/build.sh

# Transfer and kernel benchmarks, then memarray / torch / CuPy side by side with a plot
# in target/transfer.png (each skips with a message without a GPU).
bench:
    ./dev.sh bench

# The abi3 wheel, into dist/.
wheel:
    ./dev.sh wheel
