// A simulation step on memarray arrays from C++/CUDA: particles in an (N, 3) float array
// move by velocity * dt in a periodic box, then a (G, G, G) int32 density grid counts
// them per cell. The kernels take memarray::Indexer (memarray/indexer.cuh); memarray
// moves the arrays to the device and orders the kernels on its stream through
// memarray::DeviceAccess: no cudaMemcpy, no event.
//
//   particles OUT_DIR [N] [G] [STEPS]
// writes OUT_DIR/{pos0,vel,pos,density}.bin (raw float32 / int32, C order) for
// check_particles.py, which replays the steps in NumPy and compares.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "memarray.hpp"

using memarray::Indexer;

constexpr float kBox = 1.0f;

// pos += vel * dt, wrapped into [0, box). Rounded multiply and add (no FMA contraction),
// so NumPy's float32 arithmetic gives the same bits.
__global__ void advance(Indexer<2> pos, Indexer<2> vel, float dt) {
    float* p = static_cast<float*>(pos.data);
    const float* v = static_cast<const float*>(vel.data);
    const uint64_t n = pos.len();
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float x = __fadd_rn(p[i], __fmul_rn(v[i], dt));
        if (x >= kBox) x = __fsub_rn(x, kBox);
        if (x < 0.0f) x = __fadd_rn(x, kBox);
        p[i] = x;
    }
}

// density[cell(p)] += 1 for each particle; cell = min(floor(x / (box / G)), G - 1).
__global__ void deposit(Indexer<2> pos, Indexer<3> density) {
    const float* p = static_cast<const float*>(pos.data);
    int* d = static_cast<int*>(density.data);
    const uint64_t g = density.shape[0];
    const float cell = kBox / static_cast<float>(g);
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < pos.shape[0];
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t idx[3];
        for (int k = 0; k < 3; ++k) {
            uint64_t c = static_cast<uint64_t>(__fdiv_rn(p[3 * i + k], cell));
            idx[k] = c < g ? c : g - 1;
        }
        atomicAdd(&d[density.offset(idx)], 1);
    }
}

static void save(const std::string& path, const void* data, size_t bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(data, 1, bytes, f) != bytes) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        std::exit(1);
    }
    std::fclose(f);
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s OUT_DIR [N] [G] [STEPS]\n", argv[0]);
        return 2;
    }
    const std::string out = argv[1];
    const uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1000000;
    const uint64_t g = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64;
    const int steps = argc > 4 ? std::atoi(argv[4]) : 10;
    const float dt = 0.01f;
    try {
        // Deterministic start: a 32-bit LCG, positions in [0, 1), velocities in [-1, 1).
        std::vector<float> p0(n * 3), v0(n * 3);
        uint32_t s = 12345u;
        auto next = [&s] { s = s * 1664525u + 1013904223u; return (s >> 8) * (1.0f / 16777216.0f); };
        for (auto& x : p0) x = next();
        for (auto& x : v0) x = 2.0f * next() - 1.0f;

        auto pos = memarray::Array::from_data<float>({n, 3}, p0);
        auto vel = memarray::Array::from_data<float>({n, 3}, v0);
        auto density = memarray::Array::zeros<int32_t>({g, g, g}, /*born on device*/ 0);
        auto stream = memarray::Stream::create(0);
        cudaStream_t cs = static_cast<cudaStream_t>(stream.handle());
        const int block = 256, grid = 1024;
        for (int step = 0; step < steps; ++step) {
            memarray::DeviceAccess p(pos, 0, stream, /*write=*/true);
            memarray::DeviceAccess v(vel, 0, stream, /*write=*/false);
            advance<<<grid, block, 0, cs>>>(p.indexer<2>(), v.indexer<2>(), dt);
            p.end();
            v.end();
        }
        {
            memarray::DeviceAccess p(pos, 0, stream, false);
            memarray::DeviceAccess d(density, 0, stream, true);
            deposit<<<grid, block, 0, cs>>>(p.indexer<2>(), d.indexer<3>());
            if (cudaGetLastError() != cudaSuccess) throw std::runtime_error("launch failed");
            p.end();
            d.end();
        }
        // Reads wait for the kernels through the arrays' events.
        auto pos_host = pos.to_vector<float>();
        auto dens_host = density.to_vector<int32_t>();
        uint64_t total = 0;
        for (auto c : dens_host) total += c;
        save(out + "/pos0.bin", p0.data(), p0.size() * 4);
        save(out + "/vel.bin", v0.data(), v0.size() * 4);
        save(out + "/pos.bin", pos_host.data(), pos_host.size() * 4);
        save(out + "/density.bin", dens_host.data(), dens_host.size() * 4);
        std::printf("particles: N=%llu G=%llu steps=%d, %llu particles deposited\n",
                    (unsigned long long)n, (unsigned long long)g, steps, (unsigned long long)total);
        return total == n ? 0 : 1;
    } catch (const memarray::Error& e) {
        std::fprintf(stderr, "memarray error %d: %s\n", (int)e.status(), e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
