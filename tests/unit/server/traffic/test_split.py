"""server/traffic/split.py: the weighted split and the sticky hash."""

from __future__ import annotations

import random
from collections import Counter

from server.traffic.split import WeightTable, key_point


def test_the_split_follows_the_weights_within_binomial_bounds() -> None:
    random.seed(7)
    table = WeightTable([(1, 90), (2, 10)])
    n = 20_000
    seen = Counter(table.pick() for _ in range(n))
    # 10% of 20,000: mean 2,000, standard deviation 42; allow 5 of them.
    assert abs(seen[2] - 2_000) < 5 * 42 and seen[1] + seen[2] == n


def test_zero_weights_get_nothing_and_order_is_kept() -> None:
    table = WeightTable([(3, 0), (2, 5), (1, 5)])
    assert table.versions == (2, 1) and table.total == 10
    assert {table.pick() for _ in range(200)} == {1, 2}
    assert not WeightTable([(1, 0)])


def test_a_key_always_lands_on_the_same_version_and_keys_spread() -> None:
    table = WeightTable([(1, 50), (2, 50)])
    for key in ("user-42", "", "ünïcode", "x" * 1000):
        assert len({table.pick(key) for _ in range(20)}) == 1
    spread = Counter(table.pick(f"user-{i}") for i in range(2_000))
    assert abs(spread[1] - 1_000) < 5 * 23  # sd of a fair split of 2,000 is about 22.4


def test_the_hash_is_stable_across_processes() -> None:
    # blake2b, not Python's salted hash(): these values never change between runs.
    assert key_point("user-42") == key_point("user-42")
    assert key_point("user-42") != key_point("user-43")
    assert key_point("a") == 0x40F89E395B66422F


def test_only_drops_versions_and_keeps_the_others_weights() -> None:
    table = WeightTable([(1, 20), (2, 30), (3, 50)])
    rest = table.only({1, 3})
    assert rest.versions == (1, 3) and rest.bounds == (20, 70)
    assert not table.only(set())
