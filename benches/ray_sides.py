"""Ray's own cost per object by kind of tensor transport, with no data moved: a one-sided
transport (the receiver fetches, as memarray's IPC transport does) against a two-sided one
(Ray runs a send on the sender beside the receive, as for NCCL), the one-sided one with
the sending actor's handle in each object's metadata, or pickled once into bytes there
instead (what a receiver unpickles only to fetch from the sender), and a plain Ray object.

    python3 benches/ray_sides.py [--rounds 60] [--count 1] [--json out.json]

Both transports do nothing: the object is a tiny host value that rides in the transport's
metadata, so what is timed is Ray's orchestration of each kind, between the same two actors,
from the producing method's return to the consumer holding the value, the cases
taking turns round by round (medians after the first five rounds). With ``--count N``
each object is a list of N values: Ray's cost per value in an object. Needs no GPU. It tells
how much of a transport's end-to-end time is Ray's and depends on the transport's kind.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
)


class Blob:
    """The object a transport carries: one int."""

    def __init__(self, v: int) -> None:
        self.v = v


@dataclass
class BlobMeta(TensorTransportMetadata):
    values: list[int] = field(default_factory=list)


class _Nothing(TensorTransportManager):
    """Moves nothing: the values ride in the metadata."""

    ONE_SIDED = False

    @property
    def tensor_transport_backend(self) -> str:  # type: ignore[override]
        return "NOTHING"

    @classmethod
    def is_one_sided(cls) -> bool:  # type: ignore[override]
        return cls.ONE_SIDED

    @staticmethod
    def can_abort_transport() -> bool:
        return False

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True

    #: The metadata's type, and its fields besides the values (`extra`).
    META: type[BlobMeta] = BlobMeta

    def extra(self) -> dict[str, Any]:
        return {}

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: list[Any]) -> BlobMeta:
        return self.META(
            tensor_meta=[((1,), "int64") for _ in rdt_object],
            tensor_device="cpu",
            values=[b.v for b in rdt_object],
            **self.extra(),
        )

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any, backend: Any = None):
        return CommunicatorMetadata()

    def recv_multiple_tensors(
        self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None
    ) -> list[Blob]:
        return [Blob(v) for v in tensor_transport_metadata.values]

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        pass

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors) -> None:
        pass

    def abort_transport(self, obj_id, communicator_metadata) -> None:
        pass


class OneSided(_Nothing):
    ONE_SIDED = True


@dataclass
class BlobMetaFrom(BlobMeta):
    """The metadata with the sending actor's handle in it (what a receiver needs to fetch
    from the sender when it cannot read its memory)."""

    source: Any = None


class TwoSided(_Nothing):
    ONE_SIDED = False


class _OneSidedFrom(OneSided):
    """A one-sided transport whose metadata names its sender (``source()``)."""

    META = BlobMetaFrom

    def source(self) -> Any:
        raise NotImplementedError

    def extra(self) -> dict[str, Any]:
        return {"source": self.source()}


class OneSidedHandleInMeta(_OneSidedFrom):
    """Carries the sender's ActorHandle in the object's metadata."""

    def source(self) -> Any:
        return ray.get_runtime_context().current_actor


_OWN_PICKLE: bytes | None = None


class OneSidedHandlePickled(_OneSidedFrom):
    """Carries the sender's ActorHandle pickled once per process, as bytes (a receiver
    unpickles it only when it must fetch from the sender)."""

    def source(self) -> Any:
        global _OWN_PICKLE
        if _OWN_PICKLE is None:
            _OWN_PICKLE = pickle.dumps(ray.get_runtime_context().current_actor)
        return _OWN_PICKLE


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--count", type=int, default=1, help="values in each object (a list)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    # Ray's workers import this file's classes by module name: its folder on their path.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    import ray_sides  # this file, as the module the workers import
    from ray.experimental.rdt.util import register_tensor_transport

    register_tensor_transport("NOTHING_ONE_SIDED", ["cpu"], ray_sides.OneSided, ray_sides.Blob)
    register_tensor_transport("NOTHING_TWO_SIDED", ["cpu"], ray_sides.TwoSided, ray_sides.Blob)
    register_tensor_transport(
        "NOTHING_HANDLE_IN_META", ["cpu"], ray_sides.OneSidedHandleInMeta, ray_sides.Blob
    )
    register_tensor_transport(
        "NOTHING_HANDLE_PICKLED", ["cpu"], ray_sides.OneSidedHandlePickled, ray_sides.Blob
    )

    @ray.remote(enable_tensor_transport=True)
    class Sender:
        def __init__(self, count: int) -> None:
            self.b = ray_sides.Blob(7) if count == 1 else [ray_sides.Blob(7) for _ in range(count)]

        @ray.method(tensor_transport="NOTHING_ONE_SIDED")
        def one(self) -> Any:
            return self.b

        @ray.method(tensor_transport="NOTHING_TWO_SIDED")
        def two(self) -> Any:
            return self.b

        @ray.method(tensor_transport="NOTHING_HANDLE_IN_META")
        def handle_in_meta(self) -> Any:
            return self.b

        @ray.method(tensor_transport="NOTHING_HANDLE_PICKLED")
        def handle_pickled(self) -> Any:
            return self.b

        def plain(self) -> Any:
            return self.b

    @ray.remote(enable_tensor_transport=True)
    class Receiver:
        def take(self, b: Any) -> int:
            return b.v if isinstance(b, ray_sides.Blob) else sum(x.v for x in b)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        s, r = Sender.remote(args.count), Receiver.remote()
        cases = {
            "one-sided transport": s.one.remote,
            "two-sided transport": s.two.remote,
            "one-sided, the sender's handle in the metadata": s.handle_in_meta.remote,
            "one-sided, the handle pickled once, as bytes": s.handle_pickled.remote,
            "plain object": s.plain.remote,
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for i in range(args.rounds):
            # Each round starts one case later: no case always follows the same one.
            for name in names[i % len(names) :] + names[: i % len(names)]:
                make = cases[name]
                t = time.perf_counter()
                if ray.get(r.take.remote(make())) != 7 * args.count:
                    print(f"{name}: the value arrived wrong")
                    return 1
                times[name].append(time.perf_counter() - t)
    finally:
        ray.shutdown()
    figures = {name: statistics.median(v[5:]) * 1e3 for name, v in times.items()}
    print(
        f"Ray {ray.__version__}, {os.cpu_count()} cores, objects of {args.count} value(s); "
        f"ms per object, medians of "
        f"{args.rounds - 5} rounds, cases taking turns:"
    )
    for name, ms in figures.items():
        print(f"  {name:48s} {ms:7.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
