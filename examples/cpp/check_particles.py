"""Replays examples/cpp/particles.cu in NumPy and compares: positions within float32
tolerance (they match bit for bit when the GPU rounds as NumPy does), density exactly.

    python3 examples/cpp/check_particles.py OUT_DIR N G STEPS
"""

import sys

import numpy as np

out, n, g, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dt, box = np.float32(0.01), np.float32(1.0)
pos = np.fromfile(f"{out}/pos0.bin", np.float32).reshape(n, 3)
vel = np.fromfile(f"{out}/vel.bin", np.float32).reshape(n, 3)
for _ in range(steps):
    pos = pos + vel * dt
    pos = np.where(pos >= box, pos - box, pos)
    pos = np.where(pos < 0, pos + box, pos)
cell = box / np.float32(g)
idx = np.minimum((pos / cell).astype(np.uint64), g - 1)
density = np.zeros((g, g, g), np.int32)
np.add.at(density, (idx[:, 0], idx[:, 1], idx[:, 2]), 1)

got_pos = np.fromfile(f"{out}/pos.bin", np.float32).reshape(n, 3)
got_density = np.fromfile(f"{out}/density.bin", np.int32).reshape(g, g, g)
np.testing.assert_allclose(got_pos, pos, rtol=0, atol=1e-6)
same_bits = int((got_pos == pos).sum())
assert (got_density == density).all(), f"density differs in {(got_density != density).sum()} cells"
diff = float(np.abs(got_pos - pos).max())
print(
    f"check_particles: positions match NumPy ({same_bits}/{pos.size} bit-identical, "
    f"max |diff| {diff:.2e}); density matches exactly ({int(density.sum())} particles)"
)
