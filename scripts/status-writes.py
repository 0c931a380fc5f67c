#!/usr/bin/env python3
"""Counts a controller's status writes from its log, by kind and by what each write changed.

Run the controller with `--log-level warn,capo_provider::controllers::writes=debug`. For
`capo-rs bench scale`, through a `--controller` wrapper that rewrites the log level the bench
passes first and keeps what the controller prints:

    #!/bin/bash
    args=("$@"); args[1]="warn,capo_provider::controllers::writes=debug"
    exec target/release/capo-rs "${args[@]}" >> /tmp/controller.log 2>&1

then:

    scripts/status-writes.py /tmp/controller.log

Each write logs its kind, its object and the names of the fields it changed, never their
values. A write is sorted into the first class it fits: a condition's status or reason changed;
only condition messages; only `addresses`; only `membersAsOf`; only members' `since`; other.
"""
import re
import sys
from collections import Counter, defaultdict

LINE = re.compile(r'writing status kind=(\S+) name="?([^" ]+)"? changed=(\S*)')
CONDITION = re.compile(r"conditions\[[^\]]+\]\.(\w+)")


def classify(fields):
    conditions = [m.group(1) for f in fields if (m := CONDITION.fullmatch(f))]
    if any(field not in ("message", "lastTransitionTime") for field in conditions):
        return "a condition's status or reason changed"
    if conditions and len(conditions) == len(fields):
        return "only a condition's message"
    if fields == ["addresses"]:
        return "only `addresses`"
    if all(f.endswith("membersAsOf") for f in fields):
        return "only `membersAsOf`"
    if all(re.fullmatch(r".*members\[\d+\]\.since", f) for f in fields):
        return "only members' `since`"
    return "other"


def main(path):
    writes = defaultdict(Counter)
    objects = defaultdict(set)
    with open(path, errors="replace") as log:
        for line in log:
            match = LINE.search(line)
            if not match:
                continue
            kind, name, changed = match.groups()
            fields = [f for f in changed.split(",") if f]
            objects[kind].add(name)
            writes[kind][classify(fields)] += 1
    for kind in sorted(writes):
        count = len(objects[kind])
        total = sum(writes[kind].values())
        print(f"{kind}: {total} writes over {count} objects, {total / count:.2f} each")
        for cls, n in writes[kind].most_common():
            print(f"  {cls:<42} {n:>7} {n / count:>7.2f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
