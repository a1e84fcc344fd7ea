"""Which sampled indices more than one rank read, counted as digests arrive and leave (watch/data.py's GD940 and
GD942), so that a sample costs what it brings: issue 22's per-sample cost linear in ranks.

- `EpochShares`: one (role, epoch)'s digests by rank and, for GD940, how many of each readable digest's indices
  (at the largest shift among them, training_data's coordinated sample) another rank also read. Brought up to
  date when asked, recounting only the ranks whose digest changed: O(KEEP) a changed digest. Recounted whole
  when the largest shift changes (about log2(samples / KEEP) times an epoch as the samples grow, or when the
  rank holding it leaves); dropped once every digest is final, until digests start leaving (memory: the open
  epochs and the one leaving KEEP_EPOCHS).
- `SplitOverlap`: one role's Subset digests by rank and whether two differ but share an index (GD942), from
  each index's count of distinct filtered sets: no pair of ranks is compared.
- `largest_leak`: the evaluation split with the most samples inside another rank's training split. The exact
  answer needs every pair of distinct splits (a largest intersection has no linear shortcut); identical splits
  are compared once (ranks seeded alike hold one split between them), and at most LEAK_PAIRS pairs of distinct
  splits are compared, in rank order: beyond that the count named is the largest found, still a true count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpudoctor.training_data import M64, MULT
from gpudoctor.watch.analysis import RankRef
from gpudoctor.watch.data_model import EpochDigest, SplitDigest

# Heuristic bound on GD942's leak search: 64 ranks' distinct splits are compared exactly (64 x 64 pairs of at
# most KEEP indices, ~20 ms); it runs when a split arrives, until a leak is found.
LEAK_PAIRS = 4096
_ONE = 0xFFFFFFFF  # EpochShares packs an index's holders as count | (sum of holder ids << 32)


def filtered(kept: Iterable[int], shift: int) -> set[int]:
    """The indices of a coordinated sample still kept at `shift` (a larger shift keeps fewer)."""
    if shift == 0:
        return set(kept)
    limit = 1 << (64 - shift)
    return {i for i in kept if (i * MULT) & M64 < limit}


class _Counts:
    """Each readable digest's indices counted across ranks at the largest shift: per index the holders and the sum
    of their ids (so the last holder of an index two ranks shared is known when the other leaves)."""

    def __init__(self, digests: dict[RankRef, EpochDigest]) -> None:
        self.counted = {ref: e for ref, e in digests.items() if not e.unreadable}
        self._shifts = Counter(e.shift for e in self.counted.values())
        self.shift = max(self._shifts, default=0)
        self._recount()

    def _recount(self) -> None:
        self._held: dict[int, int] = {}
        self._shared: dict[int, int] = {}  # holder id -> its indices another rank holds too
        self._ids: dict[RankRef, int] = {}
        self._next = 0  # ids are never reused: an index's sum of holder ids names its last holder
        self._sets: dict[RankRef, tuple[int, ...]] = {}  # readable ref -> its indices at the shift (not filtered again)
        for ref, e in self.counted.items():
            s = filtered(e.kept, self.shift)
            self._sets[ref] = tuple(s)
            self._give(self._id(ref), s)

    def _id(self, ref: RankRef) -> int:
        x = self._ids.get(ref)
        if x is None:
            x = self._ids[ref] = self._next = self._next + 1
        return x

    def shared(self, ref: RankRef) -> int:
        return self._shared.get(self._ids[ref], 0)

    def size(self, ref: RankRef) -> int:
        """`ref`'s sampled indices at the shift."""
        return len(self._sets[ref])

    def update(self, ref: RankRef, e: EpochDigest | None) -> None:
        old = self.counted.pop(ref, None)
        new = e if e is not None and not e.unreadable else None
        if old is None and new is None:
            return
        if old is not None:
            self._shifts[old.shift] -= 1
            if not self._shifts[old.shift]:
                del self._shifts[old.shift]
        if new is not None:
            self.counted[ref] = new
            self._shifts[new.shift] += 1
        shift = max(self._shifts, default=0)
        if shift != self.shift:
            self.shift = shift
            self._recount()
            return
        a = set(self._sets.pop(ref, ()))
        b = filtered(new.kept, shift) if new is not None else set()
        x = self._id(ref)
        self._take(x, a - b)
        self._give(x, b - a)
        if new is not None:
            self._sets[ref] = tuple(b)
        else:
            del self._ids[ref], self._shared[x]

    def _give(self, x: int, indices: Iterable[int]) -> None:
        held, shared, bump, mine = self._held, self._shared, 1 | (x << 32), 0
        for i in indices:
            v = held.get(i)
            if v is None:
                held[i] = bump
                continue
            if v & _ONE == 1:  # its one holder now shares it
                shared[v >> 32] += 1
            mine += 1
            held[i] = v + bump
        shared[x] = shared.get(x, 0) + mine

    def _take(self, x: int, indices: Iterable[int]) -> None:
        held, shared, bump, mine = self._held, self._shared, 1 | (x << 32), 0
        for i in indices:
            v = held[i] - bump
            left = v & _ONE
            if not left:
                del held[i]
                continue
            held[i] = v
            mine += 1
            if left == 1:  # its last holder no longer shares it
                shared[v >> 32] -= 1
        shared[x] = shared.get(x, 0) - mine


class EpochShares:
    """One (role, epoch): each rank's digest, and (counts()) the indices of each that another rank read too."""

    def __init__(self) -> None:
        self.digests: dict[RankRef, EpochDigest] = {}
        self._counts: _Counts | None = None
        self._stale: set[RankRef] = set()
        self._leaving = False  # a digest left: the others follow (KEEP_EPOCHS), counted one by one

    def put(self, ref: RankRef, e: EpochDigest | None) -> None:
        """`ref`'s digest is now `e` (None: it has none)."""
        if e is None:
            self.digests.pop(ref, None)
            self._leaving = True
        else:
            self.digests[ref] = e
        if self._counts is not None:
            self._stale.add(ref)

    def counts(self) -> _Counts:
        if self._counts is None:
            self._counts = _Counts(self.digests)
        for ref in self._stale:
            self._counts.update(ref, self.digests.get(ref))
        self._stale.clear()
        return self._counts

    def settle(self) -> None:
        """Drop the counts once every digest is final: a finished epoch changes again when it leaves the ranks'
        KEEP_EPOCHS (or a rank restarts), counted again then and kept while its digests leave, one rank after
        another."""
        if self._counts is not None and not self._leaving and all(e.final for e in self.digests.values()):
            self._counts = None
            self._stale.clear()


class SplitOverlap:
    """One role's splits by rank, and whether two of them differ but share an index (a sampled one)."""

    def __init__(self) -> None:
        self.splits: dict[RankRef, SplitDigest] = {}
        self._bases: Counter[int] = Counter()
        self._hashes: Counter[str] = Counter()
        self._shifts: Counter[int] = Counter()
        self.shift = 0
        self._recount()

    def _recount(self) -> None:
        self._sets: dict[frozenset[int], Counter[int]] = {}  # a filtered set -> its splits' lengths
        self._member: dict[int, int] = {}  # index -> distinct sets holding it
        self._shared = 0  # indices held by two distinct sets
        self._lengths = 0  # nonempty sets held by splits of different lengths
        for s in self.splits.values():
            self._add(frozenset(filtered(s.kept, self.shift)), s.n)

    def put(self, ref: RankRef, s: SplitDigest | None) -> None:
        old = self.splits.pop(ref, None)
        for split, step in ((old, -1), (s, 1)):
            if split is not None:
                self._bases[split.base] += step
                self._hashes[split.hash] += step
                self._shifts[split.shift] += step
        for counter in (self._bases, self._hashes, self._shifts):
            for key in [k for k, n in counter.items() if not n]:
                del counter[key]
        if s is not None:
            self.splits[ref] = s
        shift = max(self._shifts, default=0)
        if shift != self.shift:
            self.shift = shift
            self._recount()
            return
        if old is not None:
            self._remove(frozenset(filtered(old.kept, shift)), old.n)
        if s is not None:
            self._add(frozenset(filtered(s.kept, shift)), s.n)

    def differs(self) -> bool:
        """Two ranks' splits differ (their hashes) and share an index, or hold the same indices but differ in
        length; all of one base data set."""
        overlap = self._shared > 0 or self._lengths > 0
        return len(self.splits) >= 2 and len(self._bases) == 1 and len(self._hashes) > 1 and overlap

    def _add(self, fs: frozenset[int], n: int) -> None:
        lengths = self._sets.get(fs)
        if lengths is None:
            lengths = self._sets[fs] = Counter()
            for i in fs:
                c = self._member[i] = self._member.get(i, 0) + 1
                self._shared += c == 2
        before = len(lengths) > 1
        lengths[n] += 1
        self._lengths += bool(fs) and len(lengths) > 1 and not before

    def _remove(self, fs: frozenset[int], n: int) -> None:
        lengths = self._sets[fs]
        before = len(lengths) > 1
        lengths[n] -= 1
        if not lengths[n]:
            del lengths[n]
        self._lengths -= bool(fs) and before and len(lengths) <= 1
        if lengths:
            return
        del self._sets[fs]
        for i in fs:
            c = self._member[i] - 1
            self._shared -= c == 1
            if c:
                self._member[i] = c
            else:
                del self._member[i]


Leak = tuple[int, RankRef, RankRef, int, int]  # estimate, eval rank, train rank, eval split's length, shift


def largest_leak(evals: list[tuple[RankRef, SplitDigest]], trains: list[tuple[RankRef, SplitDigest]]) -> Leak | None:
    """The pair (evaluation split of one rank, training split of another, of one base data set) sharing the most
    samples (estimated from the common sampled indices at the larger shift): the first such pair in the order of
    the lists, as comparing every pair in that order finds it. See the module docstring for the bound."""
    eclasses, tclasses = _classes(evals), _classes(trains)
    by_base: dict[int, list[tuple[tuple[int, int, int, tuple[int, ...]], list[tuple[int, RankRef]]]]] = {}
    for key, entries in tclasses.items():
        by_base.setdefault(key[0], []).append((key, entries))
    sets: dict[tuple[object, int], set[int]] = {}

    def at(key: tuple[int, int, int, tuple[int, ...]], shift: int) -> set[int]:
        got = sets.get((key, shift))
        if got is None:
            got = sets[key, shift] = filtered(key[3], shift)
        return got

    best: tuple[int, int, int, RankRef, RankRef, int, int] | None = None  # estimate, i, j, then the Leak's rest
    budget = LEAK_PAIRS
    for ekey, eentries in eclasses.items():
        for tkey, tentries in by_base.get(ekey[0], ()):
            if budget <= 0:
                break
            budget -= 1
            first = _first_pair(eentries, tentries)
            if first is None:
                continue
            shift = max(ekey[2], tkey[2])
            common = len(at(ekey, shift) & at(tkey, shift))
            if not common:
                continue
            (i, eref), (j, tref) = first
            estimate = common * (1 << shift)
            if best is None or estimate > best[0] or (estimate == best[0] and (i, j) < best[1:3]):
                best = (estimate, i, j, eref, tref, ekey[1], shift)
    if best is None:
        return None
    estimate, _, _, eref, tref, size, shift = best
    return estimate, eref, tref, size, shift


def _classes(
    splits: list[tuple[RankRef, SplitDigest]],
) -> dict[tuple[int, int, int, tuple[int, ...]], list[tuple[int, RankRef]]]:
    """Identical splits (base, length, shift, sample) with their positions and ranks, in order of first appearance."""
    out: dict[tuple[int, int, int, tuple[int, ...]], list[tuple[int, RankRef]]] = {}
    for position, (ref, s) in enumerate(splits):
        out.setdefault((s.base, s.n, s.shift, s.kept), []).append((position, ref))
    return out


def _first_pair(
    eentries: list[tuple[int, RankRef]], tentries: list[tuple[int, RankRef]]
) -> tuple[tuple[int, RankRef], tuple[int, RankRef]] | None:
    """The first (eval entry, train entry) of two different ranks, in the lists' order."""
    first = tentries[0]
    other = next((t for t in tentries if t[1] != first[1]), None)
    for e in eentries:
        if e[1] != first[1]:
            return e, first
        if other is not None:
            return e, other
    return None
