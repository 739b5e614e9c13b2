"""docs/architecture.md stays true to the code: every file or folder it names in backticks
exists in the repository, and every type (CamelCase name) it cites is defined in the
sources (a struct, enum, trait, class or an enum's variant), is Python's, or is one of the
outside names listed here."""

from __future__ import annotations

import builtins
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"

#: Names the document cites that are not the project's: other libraries' types, and the
#: error variants it names as replaced.
OUTSIDE = {
    "AtomicU64",  # std
    "PyRefMut",  # pyo3
    "PanicException",  # pyo3
    "WorkerPlugin",  # distributed
    "CallbackMemoryResource",  # RMM
    "BadEnv",  # the error variants SettingError replaced, named as history
    "BadSetting",
}
#: Paths the document names as not being there.
NOT_THERE = {"kernels-cuda/ptx/"}

PATH = re.compile(r"[\w./-]+\.(?:rs|py|pyi|sh|md|h|hpp|cu|toml|json|ipynb)|[\w-]+(?:/[\w-]+)*/")
TYPE = re.compile(r"([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)(?:::\w+)?")


#: Folders that are build output, caches or staged copies, not the project's files.
NOT_SOURCE = {"target", "gpu-run", "gpu-old", "node_modules", "__pycache__"}


def repo_files() -> list[str]:
    """The repository's files, read from the tree (a copy without its git history, as on
    the GPU machine, has them too): hidden folders and build output left out."""
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_SOURCE]
        rel = pathlib.Path(top).relative_to(ROOT)
        out += [(rel / f).as_posix() for f in files]
    return out


def cited() -> tuple[set[str], set[str]]:
    paths: set[str] = set()
    types: set[str] = set()
    for tick in re.findall(r"`([^`\n]+)`", DOC.read_text()):
        for tok in re.split(r"[\s,()]+", tick):
            tok = tok.strip("`:;").removeprefix("./").rstrip(".")
            if PATH.fullmatch(tok) and not tok.startswith(("http", "//")):
                paths.add(tok)
            m = TYPE.fullmatch(tok)
            if m:
                types.add(m.group(1))
    return paths, types


def exists(path: str, files: list[str]) -> bool:
    if path.endswith("/"):
        return any(("/" + f).find("/" + path) >= 0 for f in files)
    return any(f == path or f.endswith("/" + path) for f in files)


def test_every_file_and_folder_the_architecture_names_exists():
    files = repo_files()
    paths, _ = cited()
    assert len(paths) > 50, paths  # the document names its rooms
    missing = sorted(p for p in paths - NOT_THERE if not exists(p, files))
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"


def test_every_type_the_architecture_cites_is_defined():
    files = repo_files()
    sources = "\n".join(
        (ROOT / f).read_text(errors="replace")
        for f in files
        if f.endswith((".rs", ".py", ".pyi", ".h", ".hpp")) and "/ptx/" not in f
    )
    defined = set(re.findall(r"\b(?:struct|enum|trait|type|class|union)\s+([A-Z]\w*)", sources))
    variants = set(re.findall(r"(?m)^\s+([A-Z]\w*)\s*(?:[({,]|$)", sources))
    _, types = cited()
    assert len(types) > 50, types
    known = defined | variants | set(dir(builtins)) | OUTSIDE
    missing = sorted(types - known)
    assert missing == [], f"docs/architecture.md cites types the code does not have: {missing}"


def test_docs_sources_tests_benches_and_scripts_cite_no_issue_numbers():
    # The next reader has the code, not the tracker: CHANGELOG.md keeps the history.
    cite = re.compile(r"\b[Ii]ssues? #?\d+")
    kinds = (".md", ".rs", ".py", ".pyi", ".c", ".h", ".hpp", ".cpp", ".cu", ".cuh", ".sh")
    found = []
    for f in repo_files():
        if f != "CHANGELOG.md" and (f.endswith(kinds) or f.startswith(("scripts/", ".ci/"))):
            for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1):
                if cite.search(line):
                    found.append(f"{f}:{n}: {line.strip()[:80]}")
    assert found == [], "\n".join(found)


def test_no_file_is_named_after_a_round_of_work():
    # A file says what it holds; which round of work made it is the CHANGELOG's business.
    named = [f for f in repo_files() if re.search(r"round[_-]?(\d+|one|two|three|four|five)", f)]
    assert named == [], named
