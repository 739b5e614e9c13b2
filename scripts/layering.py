#!/usr/bin/env python3
"""Layering check (issue 14, point 8): no module imports one above it.

Reads every `crate::<module>` path outside comments and `#[cfg(test)]` modules in each
crate's sources and fails when a module names a module of a higher layer than its own.
Modules of one layer may use each other (stream <-> event). The layers are the ones
docs/architecture.md ("Layers inside the crates") lists; keep the two in step.

    python3 scripts/layering.py          # prints each crate's edges, exits 1 on a climb
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Bottom up; one inner list is one layer.
LAYERS = {
    "crates/memarray-core/src": [
        ["error", "dtype", "npy_literal", "fork"],
        ["shape"],
        ["indexer", "lock", "npy"],
        ["resource"],
        ["host", "spill"],
    ],
    "crates/memarray-dlpack/src": [
        ["error"],
        ["device", "layout"],
        ["pool"],
        ["export", "import"],
    ],
    "crates/memarray-cuda/src": [
        ["error", "driver", "per_device"],
        ["device"],
        ["stream", "event"],
        ["resource"],
        ["buffer"],
        ["transfer", "staging", "route", "sync"],
        ["kernel", "ipc", "spill", "nvrtc"],
        ["array"],
        ["nccl", "launch"],
        ["testing"],
    ],
    "crates/memarray-c/src": [
        ["error"],
        ["stream"],
        ["resource"],
        ["array"],
        ["access", "dlpack", "kernel"],
    ],
    "bindings-python/src": [
        ["errors", "convert", "once"],
        ["dtype", "strided"],
        ["device", "fork"],
        ["stream"],
        ["resources", "host_pool"],
        ["interop", "cuda_core"],
        ["array"],
        [
            "element",
            "numpy",
            "buffer",
            "conventions",
            "ipc",
            "pickle",
            "born",
            "distributed",
            "cuda",
            "launch",
            "spill",
        ],
        ["dlpack", "batch"],
    ],
}

TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*$")
PATH = re.compile(r"crate::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))")


def uses(text: str) -> set[str]:
    """Top-level modules named through `crate::` outside comments and test modules."""
    out: set[str] = set()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if TEST_MOD.match(line):
            break  # the test module comes last (clippy's items_after_test_module)
        code = line.split("//", 1)[0]
        for group, single in PATH.findall(code):
            names = [single] if single else [g.strip().split("::")[0] for g in group.split(",")]
            out.update(n for n in names if n)
        i += 1
    return out


def check(src: str, layers: list[list[str]]) -> list[str]:
    rank = {m: r for r, layer in enumerate(layers) for m in layer}
    base = ROOT / src
    errors = []
    edges: dict[str, set[str]] = {}
    for path in sorted(base.rglob("*.rs")):
        rel = path.relative_to(base)
        module = rel.parts[0].removesuffix(".rs")
        if module in ("lib", "main"):
            continue
        if module not in rank:
            errors.append(f"{src}/{rel}: module {module} is in no layer of scripts/layering.py")
            continue
        for used in uses(path.read_text()):
            if used == module or used not in rank:
                continue  # itself, or a crate-root re-export
            edges.setdefault(module, set()).add(used)
            if rank[used] > rank[module]:
                errors.append(
                    f"{src}/{rel}: {module} (layer {rank[module]}) imports {used} "
                    f"(layer {rank[used]}), which is above it"
                )
    for m in sorted(edges):
        print(f"  {m} -> {', '.join(sorted(edges[m]))}")
    return errors


def main() -> int:
    errors = []
    for src, layers in LAYERS.items():
        print(f"{src}:")
        errors += check(src, layers)
    for e in errors:
        print("!!", e)
    print(f"layering: {'ok' if not errors else f'{len(errors)} climbing import(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
