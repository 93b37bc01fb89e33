"""Capacity and allocation speed on a large fleet, and reservations per second on PostgreSQL.

    .venv/bin/python bench/capacity_bench.py [--nodes 10000] [--json] [--pg URL] [--reservers 8]

Figures: median wall time of `capacity()` and `allocate()` on a 10,000-node, 80,000-GPU H200
inventory with 40% of GPUs busy (target <= 50 ms each), beside the peer measured in the same
run: a plain free-GPU count over the same nodes (what most dashboards call capacity), so the
ratio is the price of counting connected shapes instead of idle GPUs. With a PostgreSQL URL,
concurrent reserver processes grant and release leases for a few seconds: reservations/s.

Whole engines of several worker groups (disaggregated prefill and decode), also <= 50 ms:
- `pd_h200`: on the H200 fleet, prefill 1 node x 8 GPUs, decode 2 nodes x 8 GPUs in one
  subblock, each engine's prefill and decode in one block (RDMA), both engines in one block;
- `pd_h200_cluster`: the same groups with no rule between them and both engines in one of
  four 2,500-node clusters: the search scans domains that large for every gate it counts, so
  this capacity is the slow case (over the target: see docs/performance.md);
- `pd_gb200`: on a 10,000-node GB200 NVL72-style fleet (cliques of 18 hosts x 4 GPUs, a
  third of the hosts busy or held), prefill 1 host x 4 GPUs, decode 2 hosts x 4 GPUs, each
  engine's prefill and decode in one NVLink clique, both engines in one clique.
Capacity there counts whole gates, each one a placement the search makes.
- `blocked_pd_h200`: a shape nothing on the H200 fleet holds (decode 12 nodes x 8 GPUs in one
  subblock with its prefill host, both engines in one block): the answer that names the group
  and the layer relaxes the shape group by group, each step a search of the whole fleet
  (`topology: prefill group needs 1 node in one subblock with decode, for 2 engines in one
  block; ...`); `blocked_pd_h200_never`: decode 16 nodes, which no subblock has free.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gate.reservations.allocator import (
    Blocked,
    ConnectRule,
    GroupRequest,
    ShapeRequest,
    allocate,
    capacity,
)
from gate.reservations.inventory import Inventory, Node


def fleet(n: int, seed: int = 0) -> tuple[list[Node], set[tuple[str, int]]]:
    rng = random.Random(seed)
    nodes = [
        Node(
            name=f"h{i:05d}",
            cluster=f"c{i // 2500}",
            region="us-east",
            sku="NVIDIA-H200",
            gpu_memory_gib=141,
            gpus=8,
            allocated_gpus=rng.choice([0, 0, 0, 2, 4, 8]),
            topology={"block": f"b{i // 64}", "subblock": f"s{i // 16}"},
            healthy=rng.random() > 0.01,
        )
        for i in range(n)
    ]
    held = {(x.name, g) for x in nodes for g in range(8 - x.allocated_gpus) if rng.random() < 0.15}
    return nodes, held


def gb200_fleet(n: int, seed: int = 0) -> tuple[list[Node], set[tuple[str, int]]]:
    """NVL72 racks: 18 hosts x 4 GPUs per clique, some hosts busy, some GPUs held by gates."""
    rng = random.Random(seed)
    nodes = [
        Node(
            name=f"gb{i:05d}",
            cluster=f"c{i // 2520}",
            region="us-south",
            sku="NVIDIA-GB200",
            gpu_memory_gib=185,
            gpus=4,
            allocated_gpus=rng.choice([0, 0, 0, 0, 4, 2]),
            topology={"clique": f"r{i // 18}.0", "block": f"b{i // 72}"},
            healthy=rng.random() > 0.01,
        )
        for i in range(n)
    ]
    held = {(x.name, g) for x in nodes for g in range(4 - x.allocated_gpus) if rng.random() < 0.1}
    return nodes, held


PD_H200 = ShapeRequest(
    sku="H200",
    groups=(GroupRequest("prefill", 8, 1, "host"), GroupRequest("decode", 16, 2, "subblock")),
    connect=(ConnectRule(("prefill", "decode"), "block"),),
    together="block",
)
PD_H200_CLUSTER = ShapeRequest(  # no rule between the groups, both engines in one cluster
    sku="H200",
    groups=(GroupRequest("prefill", 8, 1, "host"), GroupRequest("decode", 16, 2, "subblock")),
    together="cluster",
)
PD_GB200 = ShapeRequest(
    sku="GB200",
    groups=(GroupRequest("prefill", 4, 1, "host"), GroupRequest("decode", 8, 2, "clique")),
    connect=(ConnectRule(("prefill", "decode"), "clique"),),
    together="clique",
)


def _blocked(decode_nodes: int) -> ShapeRequest:
    return ShapeRequest(
        sku="H200",
        groups=(
            GroupRequest("prefill", 8, 1, "host"),
            GroupRequest("decode", 8 * decode_nodes, decode_nodes, "subblock"),
        ),
        connect=(ConnectRule(("prefill", "decode"), "subblock"),),
        together="block",
    )


BLOCKED_PD_H200 = _blocked(12)
BLOCKED_PD_H200_NEVER = _blocked(16)


def timed(fn: Any, repeat: int = 7) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return statistics.median(runs)


def _message(answer: object) -> str:
    assert isinstance(answer, Blocked), answer  # the blocked cases must stay blocked
    return f"{answer.code}: {answer.message}"


def _reserver(url: str, seconds: float, barrier: Any, out: Any) -> None:
    from gate.core.database import make_engine, make_sessionmaker
    from gate.reservations import leases

    inv = Inventory(name="bench", nodes=fleet(500, seed=1)[0])
    factory = make_sessionmaker(make_engine(url))
    shape = ShapeRequest(sku="H200", gpus_per_engine=1)
    barrier.wait()
    done, t_end = 0, time.monotonic() + seconds
    while time.monotonic() < t_end:
        g = leases.reserve(factory, inv, shape, holder="bench", gate_id=None, ttl_s=60)
        leases.release(factory, g.reservation_id, "bench")
        done += 1
    out.put(done)


def pg_rate(url: str, reservers: int, seconds: float) -> float:
    from gate.core.database import make_engine, upgrade

    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(reservers), ctx.Queue()
    procs = [
        ctx.Process(target=_reserver, args=(url, seconds, barrier, q)) for _ in range(reservers)
    ]
    for p in procs:
        p.start()
    total = sum(q.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pg", default=os.environ.get("GATE_BENCH_POSTGRES_URL"))
    ap.add_argument("--reservers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    nodes, held = fleet(args.nodes)
    single = ShapeRequest(sku="H200", gpus_per_engine=4)
    multi = ShapeRequest(
        sku="H200",
        gpus_per_engine=16,
        nodes_per_engine=2,
        engine_level="subblock",
        together="block",
    )
    peer = timed(lambda: sum(x.gpus - x.allocated_gpus for x in nodes if x.healthy) - len(held))
    gb_nodes, gb_held = gb200_fleet(args.nodes)
    rows = {
        "capacity_4gpu_ms": timed(lambda: capacity(nodes, single, held)),
        "allocate_4gpu_ms": timed(lambda: allocate(nodes, single, held)),
        "capacity_2x8gpu_subblock_ms": timed(lambda: capacity(nodes, multi, held)),
        "allocate_2x8gpu_subblock_ms": timed(lambda: allocate(nodes, multi, held)),
        "capacity_pd_h200_ms": timed(lambda: capacity(nodes, PD_H200, held)),
        "allocate_pd_h200_ms": timed(lambda: allocate(nodes, PD_H200, held)),
        "capacity_pd_h200_cluster_ms": timed(lambda: capacity(nodes, PD_H200_CLUSTER, held)),
        "allocate_pd_h200_cluster_ms": timed(lambda: allocate(nodes, PD_H200_CLUSTER, held)),
        "capacity_pd_gb200_ms": timed(lambda: capacity(gb_nodes, PD_GB200, gb_held)),
        "allocate_pd_gb200_ms": timed(lambda: allocate(gb_nodes, PD_GB200, gb_held)),
        "blocked_pd_h200_ms": timed(lambda: allocate(nodes, BLOCKED_PD_H200, held)),
        "blocked_pd_h200_never_ms": timed(lambda: allocate(nodes, BLOCKED_PD_H200_NEVER, held)),
        "peer_free_gpu_count_ms": peer,
    }
    doc: dict[str, Any] = {
        "nodes": len(nodes),
        "gpus": sum(x.gpus for x in nodes),
        "held_by_gates": len(held),
        **{k: round(v, 2) for k, v in rows.items()},
        "capacity_vs_peer_ratio": round(rows["capacity_4gpu_ms"] / peer, 1),
        "gate_shapes_4gpu": capacity(nodes, single, held).gates,
        "whole_gates_pd_h200": capacity(nodes, PD_H200, held).gates,
        "whole_gates_pd_h200_cluster": capacity(nodes, PD_H200_CLUSTER, held).gates,
        "whole_gates_pd_gb200": capacity(gb_nodes, PD_GB200, gb_held).gates,
        "blocked_pd_h200": _message(allocate(nodes, BLOCKED_PD_H200, held)),
        "blocked_pd_h200_never": _message(allocate(nodes, BLOCKED_PD_H200_NEVER, held)),
    }
    if args.pg:
        doc["pg_reservers"] = args.reservers
        doc["pg_reservations_per_s"] = round(pg_rate(args.pg, args.reservers, args.seconds), 1)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"inventory: {doc['nodes']} nodes, {doc['gpus']} GPUs, {doc['held_by_gates']} held by gates"
    )
    for k, v in rows.items():
        print(f"  {k:<32} {v:8.2f} ms")
    print(f"  shape-aware capacity costs {doc['capacity_vs_peer_ratio']}x a plain free-GPU count")
    print(
        f"  whole prefill/decode gates: {doc['whole_gates_pd_h200']} (H200), "
        f"{doc['whole_gates_pd_h200_cluster']} (H200, together: cluster), "
        f"{doc['whole_gates_pd_gb200']} (GB200, {len(gb_nodes)} nodes)"
    )
    print(f"  blocked: {doc['blocked_pd_h200']}")
    print(f"  blocked: {doc['blocked_pd_h200_never']}")
    if "pg_reservations_per_s" in doc:
        print(
            f"  PostgreSQL: {doc['pg_reservations_per_s']} reservations/s "
            f"(reserve + release) with {args.reservers} concurrent reservers"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
