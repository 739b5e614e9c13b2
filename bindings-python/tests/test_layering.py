"""scripts/layering.py: paths resolve through `super::` and `pub use`
re-exports to the file that defines them, a circle among a crate's files or the Python
package's modules fails, and the repository has none."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

from children import run_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "layering.py"

spec = importlib.util.spec_from_file_location("layering", SCRIPT)
assert spec is not None and spec.loader is not None
layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layering)


def crate(tmp_path: pathlib.Path, files: dict[str, str]) -> object:
    for name, text in files.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return layering.Crate(tmp_path)


def names(c, edges) -> dict[str, set[str]]:
    n = {m: str(c.files[m].relative_to(c.src)) for m in c.files}
    return {n[a]: {n[b] for b in bs} for a, bs in edges.items()}


def test_paths_resolve_through_super_and_re_exports(tmp_path):
    c = crate(
        tmp_path,
        {
            "lib.rs": "pub mod a;\npub mod c;\npub use a::Thing;\n",
            "a/mod.rs": "mod inner;\npub use inner::Thing;\n",
            "a/inner.rs": "pub struct Thing;\nuse super::super::c::helper; // a call\n",
            "c.rs": "use crate::Thing;\npub fn helper() {}\n",
        },
    )
    e = names(c, c.edges())
    assert e["c.rs"] == {"a/inner.rs"}, e  # crate::Thing -> a::Thing -> a/inner.rs
    assert e["a/inner.rs"] == {"c.rs"}, e
    circles = layering.cycles(e)
    assert circles == [["a/inner.rs", "c.rs"]], circles


def test_use_trees_and_inline_paths_count_comments_and_tests_do_not(tmp_path):
    c = crate(
        tmp_path,
        {
            "lib.rs": "pub mod x;\npub mod y;\npub mod z;\n",
            "x.rs": "use crate::{y::{self, Y}, z::Z as Zed};\n// crate::nothing::here\n",
            "y.rs": "pub struct Y;\npub fn f() { let _ = crate::z::g(); }\n",
            "z.rs": "pub struct Z;\npub fn g() {}\n#[cfg(test)]\nmod tests { use crate::x; }\n",
            "y/tests.rs": "use crate::x;\n",  # a test module file: no edge either
        },
    )
    e = names(c, c.edges())
    assert e == {"x.rs": {"y.rs", "z.rs"}, "y.rs": {"z.rs"}}, e
    assert layering.cycles(e) == []


def test_a_wings_rooms_are_layered_from_its_door(monkeypatch, tmp_path):
    # The copy wing's rooms are named `crate::copy::<room>`; a room below importing one
    # above it climbs, and the door (mod.rs) may use them all.
    wing = tmp_path / "src" / "copy"
    files = {
        "mod.rs": "pub mod threads;\npub mod staged;\nuse crate::copy::staged::run;\n",
        "threads.rs": "use crate::copy::staged::Direction;\nuse crate::error::Result;\n",
        "staged/mod.rs": "use crate::copy::threads::parallel;\n",
    }
    for name, text in files.items():
        (wing / name).parent.mkdir(parents=True, exist_ok=True)
        (wing / name).write_text(text)
    monkeypatch.setattr(layering, "ROOT", tmp_path)
    monkeypatch.setitem(layering.PREFIX, "src/copy", "crate::copy::")
    errors = layering.check("src/copy", [["threads"], ["staged"]])
    assert errors == [
        "src/copy/threads.rs: threads (layer 0) imports staged (layer 1), which is above it"
    ], errors


def test_a_side_door_into_the_copy_wing_is_caught(monkeypatch, tmp_path):
    # Only the copy wing names its rooms and the driver's copy calls.
    src = tmp_path / "src"
    files = {
        "copy/mod.rs": "mod direct;\npub use direct::copy_htod;\n",
        "copy/direct.rs": "use crate::driver::memcpy_htod_async;\n",
        "array/good.rs": "use crate::copy::{self, Span};\n// copy::direct in a comment\n"
        "fn f() { copy::copy_htod(); copy::pack_layout(); }\n",
        "array/side.rs": "use crate::copy::{self, direct};\n",
        "array/batch.rs": "fn f() { unsafe { driver::memcpy_batch_async() } }\n",
        "array/inline.rs": "fn f() { crate::copy::staged::to_device(); }\n",
        "resource/mod.rs": "fn z() { driver::memset_d8_async() }\n",
        "driver/mod.rs": "pub fn memcpy_htod_async() {}\n",
        "array/tested.rs": "fn f() {}\n#[cfg(test)]\nmod tests { use crate::copy::direct; }\n",
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    monkeypatch.setattr(layering, "ROOT", tmp_path)
    errors = layering.side_doors("src/copy", layering.DOORS["crates/memarray-cuda/src/copy"])
    caught = sorted(e.split(":")[0] for e in errors)
    assert caught == ["src/array/batch.rs", "src/array/inline.rs", "src/array/side.rs"], errors
    assert "`driver::memcpy_batch_async`" in " ".join(errors)


def test_the_repository_has_no_climb_and_no_circle():
    r = run_command([sys.executable, str(SCRIPT)], cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "layering: ok" in r.stdout
    assert layering.python_circles() == []
