#!/usr/bin/env python3
"""Layering check: no module imports one above it,
and no file imports itself back through others.

1. Layers: every `crate::<module>` path outside comments and `#[cfg(test)]` modules
   (and `tests.rs` files, test modules of their own) in each crate's sources names a
   module of its own layer or below. The layers are the ones docs/architecture.md
   ("Layers inside the crates") lists; keep the two in step.
2. Doors: a wing with one door (`DOORS`: the copy wing) is entered through its
   `mod.rs` alone. No file of its crate outside the wing names one of its rooms
   (`copy::direct`, `copy::{self, staged}`) or a driver call that moves bytes
   (`driver::memcpy_*`, `driver::memset_*`), but the few `allowed`, each with its reason.
3. Circles, file by file: every `crate::`, `super::` and `self::` path (in `use` trees
   too) is resolved to the file that defines what it names, through `pub use`
   re-exports (`crate::MemArray` is `array/mod.rs`'s re-export of `array/raw.rs`'s type:
   an edge to `raw.rs`). Any cycle among a crate's files fails, as does one among the
   Python package's modules (`bindings-python/python/memarray`, every import but those
   under `if TYPE_CHECKING:`, lazy ones included).

    python3 scripts/layering.py          # prints each crate's edges, exits 1 on either
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Bottom up; one inner list is one layer.
LAYERS = {
    "crates/memarray-core/src": [
        ["error", "dtype", "fork", "env"],
        ["shape", "dtype_lookup", "layout"],
        ["indexer", "lock", "npy", "safetensors"],
        ["resource"],
        ["host", "spill", "foreign"],
    ],
    "crates/memarray-dlpack/src": [
        ["error"],
        ["device", "layout"],
        ["pool"],
        ["export", "import"],
    ],
    "crates/memarray-cuda/src": [
        ["error", "driver", "nvtx", "per_device", "parked"],
        ["env", "device"],
        ["stream", "event", "module", "graph"],
        ["resource"],
        ["buffer"],
        ["copy"],
        ["ipc", "spill", "sleep"],
        ["array"],
        ["nccl", "launch"],
    ],
    "crates/memarray-seed/src": [
        ["element"],
        ["host", "kernel"],
    ],
    "crates/memarray-testing/src": [
        ["conformance", "gpu"],
    ],
    # A wing's rooms, bottom up (paths `crate::copy::<room>`).
    "crates/memarray-cuda/src/copy": [
        ["threads", "direct", "many", "pack"],
        ["staged"],
        ["route"],
        ["batch"],
    ],
    "crates/memarray-c/src": [
        ["error"],
        ["handle", "device"],
        ["stream"],
        ["resource", "graph"],
        ["array"],
        ["access", "dlpack", "kernel"],
    ],
    "bindings-python/src": [
        ["errors", "convert", "once", "held", "gil", "sources", "env"],
        ["dtype"],
        ["device", "fork"],
        ["stream", "foreign"],
        ["graph"],
        ["resources", "host_pool"],
        ["interop"],
        ["array"],
        ["locked"],
        [
            "element",
            "copying",
            "numpy",
            "byte_range",
            "buffer",
            "conventions",
            "familiar",
            "ipc",
            "pickle",
            "born",
            "safetensors",
            "distributed",
            "cuda",
            "cai",
            "copy_settings",
            "launch",
            "spill",
            "table",
        ],
        ["dlpack", "batch"],
    ],
}

TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*$")


def path_re(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))")


#: Where each checked tree's modules are named from: the crate root, or a wing's door.
PREFIX = {"crates/memarray-cuda/src/copy": "crate::copy::"}


def uses(text: str, prefix: str = "crate::") -> set[str]:
    """Top-level modules (of the crate, or of a wing) named through `prefix` outside
    comments and test modules."""
    path = path_re(prefix)
    out: set[str] = set()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if TEST_MOD.match(line):
            break  # the test module comes last (clippy's items_after_test_module)
        code = line.split("//", 1)[0]
        for group, single in path.findall(code):
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
        if path.name == "tests.rs":
            continue  # a `#[cfg(test)] mod tests;` file, as test modules inside files
        rel = path.relative_to(base)
        module = rel.parts[0].removesuffix(".rs")
        if module in ("lib", "main", "mod"):
            continue  # the crate's or the wing's door
        if module not in rank:
            errors.append(f"{src}/{rel}: module {module} is in no layer of scripts/layering.py")
            continue
        for used in uses(path.read_text(), PREFIX.get(src, "crate::")):
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


# ---------------------------------------------------------------- file-level circles

USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);", re.S)
INLINE = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
PUB_USE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", re.S)


def code_of(text: str) -> str:
    """The text before the test module, without comments and string literals' contents."""
    out = []
    for line in text.splitlines():
        if TEST_MOD.match(line):
            break
        out.append(line.split("//", 1)[0])
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', "\n".join(out))


def expand(tree: str, prefix: list[str]) -> list[list[str]]:
    """A use tree (`a::{b, c::D as E, self}`) as the full paths it names."""
    tree = re.sub(r"\s+", "", tree)
    if not tree:
        return []
    depth, cut = 0, -1
    for i, ch in enumerate(tree):  # the first `::{` at depth 0 splits head and group
        if ch == "{":
            if depth == 0 and cut < 0:
                cut = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if cut < 0:
        path = tree.split(" as ")[0].split("as")[0] if "as" in tree.split("::")[-1] else tree
        parts = [p for p in re.split(r"::", re.sub(r"as[A-Za-z_0-9]+$", "", path)) if p]
        return [prefix + parts]
    head = [p for p in tree[:cut].split("::") if p]
    inner = tree[cut + 1 : -1]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in items:
        if item == "self":
            out.append(prefix + head)
        elif item:
            out += expand(item, prefix + head)
    return out


class Crate:
    """A crate's files, their module paths, and name resolution through re-exports."""

    def __init__(self, src: pathlib.Path) -> None:
        self.src = src
        self.files: dict[tuple[str, ...], pathlib.Path] = {}
        for f in sorted(src.rglob("*.rs")):
            if f.name == "tests.rs":
                continue  # test modules, as `#[cfg(test)]` ones inside files
            rel = f.relative_to(src).with_suffix("")
            parts = tuple(rel.parts)
            if parts in (("lib",), ("main",)):
                parts = ()
            elif parts[-1] == "mod":
                parts = parts[:-1]
            self.files[parts] = f
        self.code = {m: code_of(f.read_text()) for m, f in self.files.items()}
        self.reexports: dict[tuple[str, ...], dict[str, list[str]]] = {}
        for m, code in self.code.items():
            table: dict[str, list[str]] = {}
            for tree in PUB_USE.findall(code):
                for path in expand(tree, []):
                    if path:
                        table[path[-1]] = path
            self.reexports[m] = table

    def absolute(self, module: tuple[str, ...], path: list[str]) -> list[str] | None:
        """`path` as seen from `module`, from the crate root (None: outside the crate)."""
        if not path:
            return None
        if path[0] == "crate":
            return path[1:]
        base = list(module)
        if path[0] == "self":
            return base + path[1:]
        if path[0] == "super":
            rest = path
            while rest and rest[0] == "super":
                if not base:
                    return None
                base, rest = base[:-1], rest[1:]
            return base + rest
        return None

    def resolve(self, path: list[str], depth: int = 0) -> tuple[str, ...] | None:
        """The module (file) defining what the absolute `path` names."""
        module: tuple[str, ...] = ()
        for i, part in enumerate(path):
            if module + (part,) in self.files:
                module = module + (part,)
                continue
            # An item of `module`, or a name it re-exports from elsewhere.
            target = self.reexports.get(module, {}).get(part)
            if target is not None and depth < 8:
                full = self.absolute(module, target)
                if full is None and target[0] not in ("crate", "self", "super"):
                    full = list(module) + target  # `pub use child::Name`
                if full is not None and full != list(module) + [part]:
                    found = self.resolve(full + path[i + 1 :], depth + 1)
                    if found is not None:
                        return found
            return module
        return module

    def edges(self) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
        out: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
        for m, code in self.code.items():
            paths: list[list[str]] = []
            for tree in USE.findall(code):
                if re.search(r"\bpub(?:\([^)]*\))?\s+use\s+" + re.escape(tree[:20]), code):
                    continue  # a re-export: followed by `resolve`, not an import of its own
                paths += expand(tree, [])
            paths += [p.split("::") for p in INLINE.findall(code)]
            for p in paths:
                full = self.absolute(m, p)
                if full is None:
                    continue
                target = self.resolve(full)
                if target is not None and target != m and target in self.files:
                    out.setdefault(m, set()).add(target)
        return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def rust_circles(src: str) -> list[str]:
    crate = Crate(ROOT / src)
    name = {m: str(crate.files[m].relative_to(ROOT / src)) for m in crate.files}
    edges = {name[a]: {name[b] for b in bs} for a, bs in crate.edges().items()}
    return [f"{src}: import circle {' -> '.join(c)}" for c in cycles(edges)]


PY_PACKAGE = "bindings-python/python/memarray"


def python_circles() -> list[str]:
    """Circles among the package's modules, subpackages included (`cluster.dask`): each
    module is named by its dotted path inside the package (`__init__` for the package's
    own, `cluster` for `cluster/__init__.py`)."""
    import ast

    base = ROOT / PY_PACKAGE
    modules: dict[str, pathlib.Path] = {}
    for f in base.rglob("*.py"):
        parts = list(f.relative_to(base).with_suffix("").parts)
        if parts == ["__init__"]:
            modules["__init__"] = f
        elif parts[-1] == "__init__":
            modules[".".join(parts[:-1])] = f
        else:
            modules[".".join(parts)] = f
    edges: dict[str, set[str]] = {}

    def package_of(name: str) -> list[str]:
        f = modules[name]
        if f.name == "__init__.py":
            return [] if name == "__init__" else name.split(".")
        return name.split(".")[:-1]

    def resolve(parts: list[str]) -> str:
        """The module `parts` names, or the nearest package above it (its __init__)."""
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts = parts[:-1]
        return "__init__"

    def walk(node: ast.AST, into: set[str], name: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    walk(sub, into, name)
                continue
            if isinstance(child, ast.ImportFrom) and child.level > 0:
                pkg = package_of(name)
                pkg = pkg[: len(pkg) - (child.level - 1)] if child.level > 1 else pkg
                target = pkg + (child.module.split(".") if child.module else [])
                if (
                    target
                    and target[-1] == "_memarray"
                    or (child.module and child.module.startswith("_memarray"))
                ):
                    pass  # the extension module
                elif child.module:
                    into.add(resolve(target))
                for a in child.names:
                    sub = ".".join([*target, a.name])
                    if sub in modules:
                        into.add(sub)
                    elif not child.module and not a.name.startswith("_memarray"):
                        into.add(resolve(target))
            elif isinstance(child, ast.ImportFrom) and child.module:
                if child.module.split(".")[0] == "memarray":
                    into.add(resolve(child.module.split(".")[1:]))
            elif isinstance(child, ast.Import):
                for a in child.names:
                    parts = a.name.split(".")
                    if parts[0] == "memarray":
                        into.add(resolve(parts[1:]))
            walk(child, into, name)

    for name, f in modules.items():
        used: set[str] = set()
        walk(ast.parse(f.read_text()), used, name)
        edges[name] = {u for u in used if u in modules and u != name}
    for name in sorted(edges):
        if edges[name]:
            print(f"  {name} -> {', '.join(sorted(edges[name]))}")
    # A submodule that imports the package's own names (`from . import MemArray`) depends
    # on __init__, which imports it back only if __init__ names it.
    return [f"{PY_PACKAGE}: import circle {' -> '.join(c)}" for c in cycles(edges)]


# ---------------------------------------------------------------- the copy wing's door

#: Each wing with one door: its directory, and what only its own files (and `allowed`
#: ones, each with its reason) may name: its rooms (`copy::<room>`, however reached) and
#: the driver calls that move bytes.
DOORS = {
    "crates/memarray-cuda/src/copy": {
        "rooms": ["batch", "direct", "many", "pack", "route", "staged", "threads"],
        "calls": re.compile(r"\bdriver::(?:\{[^}]*\b)?(memcpy\w*|memset\w*)"),
        "allowed": {
            "driver": "the driver's own wrappers",
            "resource/mod.rs": "zeroed allocations: resources sit below the copy wing",
        },
    },
}


def side_doors(wing: str, door: dict) -> list[str]:
    """Files of the wing's crate outside the wing that name one of its rooms or a driver
    copy call (outside comments and test modules): each is a side door."""
    base = ROOT / wing
    src = base.parent
    name = base.name
    room = re.compile(rf"\b{name}::(?:\{{[^}}]*\b)?({'|'.join(door['rooms'])})\b")
    errors = []
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if path.name == "tests.rs" or rel.parts[0] == name:
            continue
        if any(str(rel) == a or rel.parts[0] == a for a in door["allowed"]):
            continue
        code = code_of(path.read_text())
        for what, pattern in (
            ("a room behind the door", room),
            ("the driver's copy call", door["calls"]),
        ):
            for m in pattern.finditer(code):
                errors.append(
                    f"{src.relative_to(ROOT)}/{rel}: names {what} `{m.group(0)}`; "
                    f"go through `{name}::`'s own calls"
                )
    return errors


def main() -> int:
    errors = []
    for wing, door in DOORS.items():
        errors += side_doors(wing, door)
    for src, layers in LAYERS.items():
        print(f"{src}:")
        errors += check(src, layers)
        if src not in PREFIX:  # a wing's files are in its crate's circle check
            errors += rust_circles(src)
    print(f"{PY_PACKAGE}:")
    errors += python_circles()
    for e in errors:
        print("!!", e)
    print(f"layering: {'ok' if not errors else f'{len(errors)} climbing import(s) or circle(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
