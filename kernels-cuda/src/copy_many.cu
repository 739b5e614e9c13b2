// copy_many: many small device-to-device copies in one launch (memarray_cuda::copy::many).
//
// Below some tens of KiB a copy costs the copy engine more in setup than in moving bytes,
// and a batch of them costs about that much each; one kernel does them all at memory
// speed. The copies travel in one by-value parameter (a table of up to COPY_MANY_MAX
// entries, about 24 KiB: CUDA 12.1 and newer take kernel parameters up to 32,764 bytes on
// Volta and newer), so a launch needs no upload of its own. Block b copies entries b,
// b + gridDim.x, ...; its threads take 16 bytes each where both addresses are 16-byte
// aligned (a tail of single bytes), single bytes otherwise.
//
// Regenerate the committed PTX with kernels-cuda/build.sh (PTX ISA 9.0, compute_75).

#define COPY_MANY_MAX 1024

struct CopyEntry {
    unsigned long long dst;
    unsigned long long src;
    unsigned long long len;
};

struct CopyTable {
    unsigned int n;
    unsigned int pad;
    CopyEntry e[COPY_MANY_MAX];
};

extern "C" __global__ void copy_many(const CopyTable t) {
    for (unsigned int i = blockIdx.x; i < t.n; i += gridDim.x) {
        const CopyEntry c = t.e[i];
        char* d = reinterpret_cast<char*>(c.dst);
        const char* s = reinterpret_cast<const char*>(c.src);
        unsigned long long head = 0;
        if (((c.dst | c.src) & 15ull) == 0) {
            const unsigned long long n16 = c.len / 16;
            uint4* d4 = reinterpret_cast<uint4*>(d);
            const uint4* s4 = reinterpret_cast<const uint4*>(s);
            for (unsigned long long k = threadIdx.x; k < n16; k += blockDim.x) d4[k] = s4[k];
            head = n16 * 16;
        }
        for (unsigned long long k = head + threadIdx.x; k < c.len; k += blockDim.x) d[k] = s[k];
    }
}
