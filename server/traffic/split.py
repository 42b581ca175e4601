"""Weighted choice between versions: a cumulative table, picked by a random point or by a hash.

A request carrying a `traffic_key` lands where the key's hash falls in the table, so one key
always lands on the same version while the weights are unchanged, whatever the protocol it came
over. Without a key the point is random, so version v answers with probability w_v / sum(w).
"""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_right
from collections.abc import Iterable


def key_point(key: str) -> int:
    """A stable 64-bit hash of a traffic key (the same in every process and on every run,
    unlike Python's salted hash())."""
    return int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )


class WeightTable:
    """Versions (in the order given) with positive weights, as cumulative bounds."""

    __slots__ = ("versions", "bounds", "total")

    def __init__(self, weights: Iterable[tuple[int, int]]) -> None:
        versions: list[int] = []
        bounds: list[int] = []
        total = 0
        for version, weight in weights:
            if weight > 0:
                total += weight
                versions.append(version)
                bounds.append(total)
        self.versions = tuple(versions)
        self.bounds = tuple(bounds)
        self.total = total

    def __bool__(self) -> bool:
        return self.total > 0

    def pick(self, key: str | None = None) -> int:
        """The version for a request: by the key's hash when given, else at random."""
        point = key_point(key) % self.total if key is not None else random.randrange(self.total)
        return self.versions[bisect_right(self.bounds, point)]

    def only(self, keep: set[int]) -> WeightTable:
        """The same table over the versions in `keep` (the others dropped out)."""
        previous = 0
        pairs = []
        for version, bound in zip(self.versions, self.bounds, strict=False):
            if version in keep:
                pairs.append((version, bound - previous))
            previous = bound
        return WeightTable(pairs)
