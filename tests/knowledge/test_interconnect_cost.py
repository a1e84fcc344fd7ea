"""Questions asked per pair of GPUs cost a pair, not a node (issue 24: `check --quick` was cubic in
GPUs, nvlink_count rebuilding the bus map and walking every link for each pair)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpudoctor import snapshot as snapshot_io
from gpudoctor.knowledge import interconnect
from gpudoctor.snapshot import Snapshot
from tests.helpers.scaled import scaled_node
from tests.paths import H100

N = 64


@pytest.fixture(scope="module")
def node() -> Snapshot:
    return snapshot_io.from_jsonable(scaled_node(json.loads(open(H100).read()), N))


def test_every_pair_of_a_large_node_walks_each_gpus_links_a_bounded_number_of_times(node, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    walks = 0
    links = interconnect._links

    def counted(gpu):  # type: ignore[no-untyped-def]
        nonlocal walks
        walks += 1
        return links(gpu)

    monkeypatch.setattr(interconnect, "_links", counted)
    labels = interconnect.matrix(node, [g.index for g in node.gpus])
    assert {labels[a][b] for a in range(N) for b in range(N) if a != b} == {"NV18"}  # every pair, through the switches
    assert walks <= 4 * N  # per GPU, not per pair (N(N-1) = 4032 ordered pairs)


def test_a_weaker_gpu_still_shows_on_its_pairs_once_the_facts_are_kept(node) -> None:  # type: ignore[no-untyped-def]
    assert interconnect.nvlink_count(node, 3, 40) == 18
    links = node.gpu(40).nvlinks
    assert isinstance(links, list)
    weaker = replace(
        node,
        gpus=[
            replace(g, nvlinks=[replace(k, active=k.link < 12) for k in links]) if g.index == 40 else g
            for g in node.gpus
        ],
    )
    assert interconnect.nvlink_count(weaker, 3, 40) == 12  # a new snapshot: its own facts
    assert interconnect.nvlink_count(weaker, 3, 41) == 18
    assert interconnect.nvlink_count(node, 3, 40) == 18  # the first one's are untouched


def test_gpu_and_pair_lookups_answer_the_first_listed_and_refuse_the_absent(node) -> None:  # type: ignore[no-untyped-def]
    twice = replace(node, gpus=[*node.gpus, replace(node.gpus[5], name="a second GPU 5")])
    assert twice.gpu(5) is node.gpus[5]
    with pytest.raises(KeyError):
        node.gpu(N)
    with pytest.raises(KeyError):
        interconnect.nvlink_count(node, 0, N)
    assert node.pair(9, 2) is node.pair(2, 9) is next(p for p in node.pairs if (p.a, p.b) == (2, 9))
    assert node.pair(2, N) is None
    assert snapshot_io.to_jsonable(node) == snapshot_io.to_jsonable(replace(node))  # kept facts are no field
