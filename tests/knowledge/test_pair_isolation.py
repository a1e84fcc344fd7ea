"""Pair selection for the retests (knowledge/pair_isolation.py `disjoint_batches`) against the
first, quadratic version kept here as the oracle: the same batches, in the same order, on random
inputs (pairs that share nodes, repeated pairs, limits from 1 to more than needed)."""

from __future__ import annotations

import random

import pytest

from gpudoctor.knowledge.pair_isolation import Pair, disjoint_batches


def oracle(pairs: list[Pair], limit: int) -> list[list[Pair]]:
    """gpudoctor 0.x's disjoint_batches, verbatim: every pair compared with every placed pair."""
    batches: list[list[Pair]] = []
    for pair in pairs:
        for batch in batches:
            if not any(set(pair) & set(other) for other in batch):
                batch.append(pair)
                break
        else:
            if len(batches) < limit:
                batches.append([pair])
    return batches


@pytest.mark.parametrize("seed", range(200))
def test_the_batches_are_the_first_versions_on_random_pairs(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(2, 40))]
    pairs = [tuple(rng.sample(nodes, 2)) for _ in range(rng.randint(0, 120))]
    limit = rng.randint(1, 12)
    assert disjoint_batches(pairs, limit) == oracle(pairs, limit)  # type: ignore[arg-type]


def test_every_batch_is_disjoint_and_pairs_beyond_the_limit_are_left_out() -> None:
    pairs: list[Pair] = [("a", "b")] * 5 + [("c", "d")]
    batches = disjoint_batches(pairs, 3)
    assert batches == [[("a", "b"), ("c", "d")], [("a", "b")], [("a", "b")]]
    for batch in batches:
        nodes = [n for p in batch for n in p]
        assert len(nodes) == len(set(nodes))
