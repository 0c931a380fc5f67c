#!/usr/bin/env python3
"""Splits a heaptrack recording of `capo-rs run` by the part of the controller that holds the
memory. Usage:

    heaptrack_print FILE.zst -p 0 -a 0 -T 0 -l 0 --flamegraph-cost-type leaked -F stacks.txt
    scripts/heap-by-part.py stacks.txt

`leaked` is what was still allocated when the process ended (its steady state: the stores
and the state around them); `peak` gives the same split at the heap's peak. The first part
whose pattern a stack matches takes its bytes.
"""
import collections
import re
import sys

PARTS = [
    ("watch stores (the objects, their keys)", r"manager::shared::drive"),
    ("changed-filters (one entry per object per subscriber)", r"shared::changed|Filter<St,Fut,F>"),
    ("Secret watches", r"SecretChanges"),
    ("controller schedulers (queued and requeued objects)", r"kube_runtime::scheduler"),
    ("reconciles in flight", r"controller::runner"),
    ("membership engine (and its metrics)", r"capo_provider::membership"),
    ("event correlation", r"controllers::events"),
    ("other metrics", r"prometheus"),
    ("status digests (LastWrites)", r"LastWrites"),
    ("HTTP connections and buffers", r"hyper|h2::"),
    ("OpenStack clients", r"openstack"),
    ("the runtime", r"tokio::"),
]


def demangle(stack):
    for a, b in (("$LT$", "<"), ("$GT$", ">"), ("$C$", ","), ("..", "::")):
        stack = stack.replace(a, b)
    return stack


def main(path):
    bytes_by_part = collections.Counter()
    total = 0
    with open(path) as stacks:
        for line in stacks:
            stack, _, cost = line.rstrip().rpartition(" ")
            cost = int(cost)
            total += cost
            stack = demangle(stack)
            part = next((name for name, pattern in PARTS if re.search(pattern, stack)), "other")
            bytes_by_part[part] += cost
    print(f"{'part':<56} {'MB':>8} {'share':>6}")
    for part, cost in bytes_by_part.most_common():
        print(f"{part:<56} {cost / 1e6:8.2f} {cost / max(total, 1):6.1%}")
    print(f"{'all':<56} {total / 1e6:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
