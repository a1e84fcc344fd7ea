"""What the ranks read, judged across ranks and epochs (GD940-GD944), from the digests of
gpudoctor/training_data.py (docs/watch.md, "What each rank reads").

`DataBook` keeps, per rank, the first epoch and the latest few epochs of each loader role and each
role's split fingerprint: bounded by ranks x roles x KEEP_EPOCHS x training_data.KEEP indices, whatever
the run's length. A verdict, once found, holds to the end of the run (the cause does not go away by
itself); it is judged again only when a new digest arrives. GD940, GD941 and GD944 widen as more ranks show
them (under load one rank gets there samples before another), and never narrow.

What a sample costs (issue 22): only the (role, epoch)s that got or lost a digest since the last judgement
are judged again (the others would give what they gave), each from an index kept up to date as digests
arrive (watch/data_overlap.py: no pair of ranks is compared); GD941 keeps each rank's repeat per role,
GD942 is judged when a split arrives or leaves. tests/watch/test_data_incremental.py holds the verdicts
to those of judging everything every time; benchmarks/data_verdicts.py measures both.

Comparing coordinated samples: two ranks' samples are compared at the larger of their shifts (each is
filtered to the smaller limit), where each holds exactly the indices below that limit: an index both
hold was read by both (no false overlap); see training_data's docstring for the chance of a miss.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpudoctor.engine.codes import Code
from gpudoctor.watch import data_codes as codes
from gpudoctor.watch.analysis import Figure, RankRef, Verdict
from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.data_model import DataReading, EpochDigest, Hello, SplitDigest
from gpudoctor.watch.data_overlap import EpochShares, SplitOverlap, filtered, largest_leak
from gpudoctor.watch.model import plural
from gpudoctor.watch.thresholds import Thresholds

__all__ = ["DataBook", "RankData", "filtered", "is_eval", "ranks_text"]

KEEP_EPOCHS = 3  # latest epochs kept per rank and role, besides the first
EVAL_ROLES = frozenset({"eval", "val", "valid", "validation", "test"})
MIN_EVIDENCE = 16  # sampled indices a rank needs before its overlap is judged (unless its epoch is complete)
MIN_PREFIX = 8  # identical first indices that prove the same order (or the same samples)

Repeat = tuple[int, int, int | None]  # GD941 on one rank: the later epoch, identical first indices, stuck epoch


def is_eval(role: str) -> bool:
    return role in EVAL_ROLES


def ranks_text(refs: Sequence[RankRef]) -> str:
    labels = [r.label for r in refs]
    if all(r.rank is not None for r in refs):
        return f"rank{'s' if len(refs) > 1 else ''} {','.join(str(r.rank) for r in refs)}"
    return ", ".join(labels)


def _order(ref: RankRef) -> tuple[bool, int, int]:
    return (ref.rank is None, ref.rank or 0, ref.pid)


@dataclass
class RankData:
    """One rank's data over the run."""

    ref: RankRef
    hello: Hello | None = None
    epochs: dict[str, dict[int, EpochDigest]] = field(default_factory=dict)  # role -> epoch -> digest
    splits: dict[str, SplitDigest] = field(default_factory=dict)

    def add(self, r: DataReading) -> list[tuple[str, int]]:
        """Keep `r`'s digests; returns the (role, epoch)s whose digest was set or dropped."""
        self.hello = r.hello or self.hello
        changed = []
        for e in r.epochs:
            kept = self.epochs.setdefault(e.role, {})
            old = kept.get(e.epoch)
            if old is not None and old.final and not e.final:
                continue  # a late partial digest never replaces a complete one
            kept[e.epoch] = e
            changed.append((e.role, e.epoch))
            later = sorted(n for n in kept if n != min(kept))
            for n in later[:-KEEP_EPOCHS]:
                del kept[n]
                changed.append((e.role, n))
        for s in r.splits:
            self.splits[s.role] = s
        return changed


def repeat_of(epochs: dict[int, EpochDigest]) -> Repeat | None:
    """GD941 on one rank and role: its first later epoch that starts with the same (shuffled) indices as its
    first epoch, how many, and the sampler's epoch when it stayed the first's."""
    if len(epochs) < 2:
        return None
    first = epochs[min(epochs)]
    for n, e in sorted(epochs.items()):
        if n == min(epochs) or e.unreadable or first.unreadable:
            continue
        m = min(len(first.prefix), len(e.prefix))
        enough = m >= MIN_PREFIX or (e.final and first.final and m == e.n == first.n and m > 1)
        shuffled = not (first.ascending and e.ascending) and first.shuffle is not False
        if enough and shuffled and first.prefix[:m] == e.prefix[:m]:
            stuck = e.sampler_epoch if e.sampler_epoch is not None and e.sampler_epoch == first.sampler_epoch else None
            return n, m, stuck
    return None


class DataBook:
    """The data verdicts of a run: feed every sample's data readings, ask for the verdicts."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.ranks: dict[tuple[int | None, int], RankData] = {}  # at most MAX_RANKS, the earliest go first
        self._holder: dict[int, tuple[int | None, int]] = {}  # rank number -> the key of the process holding it
        self._hellos: dict[tuple[int | None, int], Hello] = {}  # the held processes' hellos, kept as they come
        # PID -> the hello of a process that said hello alone while another held its rank: a spawned
        # DataLoader worker (of an older gpudoctor) says hello as it exits, every epoch, and is no rank. It
        # takes the rank once it sends more (or steps). One per process, not per rank: a helper's hello
        # does not push out a restarted rank's (review 6 F6); at most MAX_RANKS, the earliest go first.
        self._pending: OrderedDict[int, DataReading] = OrderedDict()
        self.found: dict[str, Verdict] = {}  # code -> the first verdict of that code, held to the end
        self._changed = False
        self._epochs: dict[tuple[str, int], EpochShares] = {}  # (role, epoch) -> its digests by rank
        self._dirty: set[tuple[str, int]] = set()  # (role, epoch)s to judge again
        self._repeats: dict[str, dict[RankRef, Repeat]] = {}  # role -> the ranks repeating their first order
        self._splits: dict[str, SplitOverlap] = {}  # role -> its splits by rank
        self._splits_dirty = False
        self._differing: set[str] = set()  # the roles whose splits differ (GD940 is not judged on them)

    def add(self, readings: Iterable[DataReading]) -> None:
        for r in readings:
            rd = self.ranks.get(r.key)
            if rd is None and r.rank is not None and r.rank in self._holder:
                pending = self._pending.pop(r.pid, None)
                if not (r.epochs or r.splits or r.loss or r.loader):
                    # a hello alone: a DataLoader worker, or the rank's next process
                    self._pending[r.pid] = replace(r, hello=r.hello or pending.hello) if pending else r
                    if len(self._pending) > MAX_RANKS:
                        self._pending.popitem(last=False)
                    continue
                if pending is not None and pending.rank == r.rank:
                    r = replace(r, hello=r.hello or pending.hello)
            self._take(r, rd)

    def _take(self, r: DataReading, rd: RankData | None) -> None:
        if rd is None:
            old = self._holder.get(r.rank) if r.rank is not None else None
            if old is not None:  # a new process for a rank seen before (a restarted job): the old is done
                self._drop(old)
            elif len(self.ranks) >= MAX_RANKS:  # more processes than a line may name: the earliest go first
                self._drop(next(iter(self.ranks)))
            rd = self.ranks[r.key] = RankData(RankRef(r.rank, r.pid))
            if r.rank is not None:
                self._holder[r.rank] = r.key
        self._index(rd, rd.add(r), r.splits)
        if r.hello is not None:
            self._hellos[r.key] = r.hello
        self._changed = self._changed or bool(r.epochs or r.splits)

    def stepping(self, pids: set[int]) -> None:
        """These processes step (they are ranks): one that only said hello for a rank another process held
        takes it now (a restarted rank that sends no data), not a DataLoader worker (it never steps)."""
        for pid in pids:
            r = self._pending.pop(pid, None)
            if r is not None and self.ranks.get(r.key) is None:
                self._take(r, None)

    def _index(self, rd: RankData, changed: list[tuple[str, int]], splits: Iterable[SplitDigest]) -> None:
        for role, n in changed:
            shares = self._epochs.get((role, n))
            if shares is None:
                shares = self._epochs[role, n] = EpochShares()
            shares.put(rd.ref, rd.epochs[role].get(n))
            if not shares.digests:
                del self._epochs[role, n]
            self._dirty.add((role, n))
        for role in {role for role, _ in changed}:
            repeat = repeat_of(rd.epochs[role])
            repeats = self._repeats.setdefault(role, {})
            if repeat is None:
                repeats.pop(rd.ref, None)
            else:
                repeats[rd.ref] = repeat
        for s in splits:
            self._splits.setdefault(s.role, SplitOverlap()).put(rd.ref, s)
            self._splits_dirty = True

    def _drop(self, key: tuple[int | None, int]) -> None:
        rd = self.ranks.pop(key)
        self._hellos.pop(key, None)
        if key[0] is not None and self._holder.get(key[0]) == key:
            del self._holder[key[0]]
        self._forget(rd)

    def _forget(self, rd: RankData) -> None:
        """A restarted rank's old process: its digests leave every index."""
        for role, epochs in rd.epochs.items():
            for n in epochs:
                self._epochs[role, n].put(rd.ref, None)
                if not self._epochs[role, n].digests:
                    del self._epochs[role, n]
                self._dirty.add((role, n))
            self._repeats.get(role, {}).pop(rd.ref, None)
        for role in rd.splits:
            self._splits[role].put(rd.ref, None)
            if not self._splits[role].splits:
                del self._splits[role]
            self._splits_dirty = True

    def hellos(self) -> dict[tuple[int | None, int], Hello]:
        """Each held process's hello (kept as readings come: a sample's verdicts read it, not rebuild it).
        Read it, do not change it."""
        return self._hellos

    def verdicts(self) -> list[Verdict]:
        if self._changed:
            self._changed = False
            self._judge()
        return list(self.found.values())

    def _hold(self, v: Verdict) -> None:
        self.found.setdefault(v.code, v)

    def _names_all(self, code: Code) -> bool:
        """The verdict of `code` is held and names every rank seen: nothing can widen it."""
        held = self.found.get(code.code)
        return held is not None and len(held.ranks) >= len(self.ranks)

    def _widens(self, code: Code, refs: Iterable[RankRef]) -> bool:
        """A verdict of `code` naming `refs` would be held: none is, or it names more ranks than the one held
        (under load some ranks show a mistake samples before the others; a verdict never narrows)."""
        held = self.found.get(code.code)
        return held is None or set(refs) > set(held.ranks)

    # -- judging -----------------------------------------------------------------------------------------
    def _judge(self) -> None:
        # An epoch whose digests did not change gives the verdict it gave: GD940 and GD944 replace a held one only
        # by a strict superset, and held ones only grow, so what did not widen it then cannot now (GD943 is held
        # once). GD941 may replace one role's verdict by another's, so its pass runs in full (from each rank's
        # cached repeat); GD942 depends on the splits alone.
        if self._splits_dirty:
            self._splits_dirty = False
            self._judge_splits()
        dirty, self._dirty = self._dirty, set()
        for role, number in sorted(dirty):
            shares = self._epochs.get((role, number))
            if shares is None or len(shares.digests) < 2:
                continue
            if is_eval(role):
                self._padding(role, number, shares.digests)
            else:
                if role not in self._differing:
                    self._not_sharded(role, number, shares)
                self._uneven(role, number, shares.digests)
            shares.settle()
        self._same_order()

    def _not_sharded(self, role: str, number: int, shares: EpochShares) -> None:
        """GD940: ranks that read the same first indices, or of whose sample a share was read by another rank.
        Judged again as more ranks have read enough, until it names every rank."""
        digests = shares.digests
        if len(digests) < 2 or self._names_all(codes.DATA_NOT_SHARDED):
            return
        readable = [(ref, e) for ref, e in digests.items() if not e.unreadable]
        same: dict[tuple[int, ...], list[RankRef]] = {}
        for ref, e in readable:
            if len(e.prefix) >= MIN_PREFIX or (e.final and e.prefix and len(e.prefix) == e.n):
                same.setdefault(e.prefix[: max(MIN_PREFIX, 1)], []).append(ref)
        twins = [refs for refs in same.values() if len(refs) > 1]
        counts = shares.counts()
        # DistributedSampler reads at most world - 1 indices twice (its padding): more shared is proof.
        padding = max([len(digests) - 1] + [e.replicas - 1 for e in digests.values() if e.replicas])
        ratios = {}
        for ref, e in readable:
            shared, size = counts.shared(ref), counts.size(ref)
            if shared > padding and (size >= MIN_EVIDENCE or e.final):
                ratios[ref] = shared / size
        named = sorted(
            {ref for refs in twins for ref in refs} | {r for r, x in ratios.items() if x >= self.th.overlap_share},
            key=_order,
        )
        if len(named) < 2 or not self._widens(codes.DATA_NOT_SHARDED, named):
            return
        seen = [ratios[r] for r in named if r in ratios]
        share = 100 * statistics.mean(seen) if seen else 100.0
        facts = [digests[ref] for ref in named]
        how = "read the same first samples in the same order" if twins else "read the same samples"
        template = (
            f"{ranks_text(named)} {how} in {role} epoch {number}: {{}}% of their sampled indices were also read by "
            f"another rank{_sampler_text(facts)}"
        )
        figure = Figure(share, template, unit="% shared")
        hint = "Pass a DistributedSampler to the DataLoader (sampler=), or shard the data per rank."
        self.found[codes.DATA_NOT_SHARDED.code] = _verdict(codes.DATA_NOT_SHARDED, figure, hint, named)

    def _uneven(self, role: str, number: int, digests: dict[RankRef, EpochDigest]) -> None:
        """GD944: a rank ended the epoch with fewer batches than another rank has run in it. Judged again as
        more ranks' loaders are known, until it names every rank."""
        if len(digests) < 2 or self._names_all(codes.UNEVEN_SHARDS):
            return
        planned = [e.expected for e in digests.values()]
        if None not in planned and len(set(planned)) > 1:  # len(loader) differs: known as the epoch starts
            counts = {ref: e.expected or 0 for ref, e in digests.items()}
            how = "the ranks' loaders give different numbers of batches"
        else:  # counted: a rank ended the epoch with fewer batches than another has run in it
            ended = [e.batches for e in digests.values() if e.final]
            counts = {ref: e.batches for ref, e in digests.items()}
            if not ended or max(counts.values()) <= min(ended):
                return
            so_far = "" if all(e.final for e in digests.values()) else " so far"
            how = f"the ranks ran different numbers of batches{so_far}"
        if not self._widens(codes.UNEVEN_SHARDS, digests):
            return
        most, fewest = max(counts.values()), min(counts.values())
        shown = ", ".join(f"{ref.label} {counts[ref]}" for ref in sorted(digests, key=_order))
        message = (
            f"{role} epoch {number}: {how} ({shown}): the rank with {most} waits in collectives the ranks with "
            f"{fewest} never join"
        )
        hint = "Give every rank the same number of batches (DistributedSampler, drop_last) or use model.join()."
        self.found[codes.UNEVEN_SHARDS.code] = _verdict(codes.UNEVEN_SHARDS, message, hint, list(digests))

    def _padding(self, role: str, number: int, digests: dict[RankRef, EpochDigest]) -> None:
        """GD943: an evaluation epoch whose ranks together read more samples than the data set holds, by
        less than one per rank (DistributedSampler's padding, not every rank reading everything)."""
        values = list(digests.values())
        if len(values) < 2 or codes.EVAL_PADDING.code in self.found or not all(e.final for e in values):
            return
        sizes = {e.len for e in values}
        if len(sizes) != 1 or None in sizes or any(e.drop_last for e in values):
            return
        size = sizes.pop()
        assert size is not None
        total = sum(e.n for e in values)
        extra = total - size
        if not 0 < extra < len(values):
            return
        message = (
            f"{role} epoch {number}: the {len(values)} ranks read {total} samples of a {size}-sample data set: "
            f"{plural(extra, 'sample')} padded by the sampler{_sampler_text(values)}, counted twice in a metric "
            "reduced over ranks"
        )
        hint = "Evaluate the remainder on its own (imagenet's drop_last=True sampler plus a remainder loader)."
        self._hold(_verdict(codes.EVAL_PADDING, message, hint, list(digests)))

    def _same_order(self) -> None:
        """GD941: a rank whose later epoch starts with the same (shuffled) indices as its first. Judged again
        as more ranks reach their second epoch: under load one rank gets there well before the others, and the
        verdict widens to name each rank that repeats its order (it never narrows)."""
        code = codes.SAME_ORDER_EVERY_EPOCH.code
        for role in sorted(role for role, repeats in self._repeats.items() if repeats):
            held = self.found.get(code)
            if held is not None and len(held.ranks) == len(self.ranks):
                return
            repeats = self._repeats[role]
            if held is not None and repeats.keys() <= set(held.ranks):
                continue
            named = sorted(repeats, key=_order)
            later, same = max(r[0] for r in repeats.values()), max(r[1] for r in repeats.values())
            stuck = [r[2] for r in repeats.values() if r[2] is not None]
            why = f"; the sampler's epoch stayed {min(stuck)}: set_epoch() is not called" if stuck else ""
            message = (
                f"{ranks_text(named)} read {role} epoch {later} in the same order as epoch 0 (the first "
                f"{same} indices identical){why}"
            )
            hint = "Call sampler.set_epoch(epoch) at the start of every epoch, before iterating the loader."
            self.found[code] = _verdict(codes.SAME_ORDER_EVERY_EPOCH, message, hint, named)

    def _judge_splits(self) -> None:
        """GD942: ranks whose Subsets of one data set differ but overlap; the roles concerned are not judged for
        GD940 (their ranks read different data sets on purpose or not, told here)."""
        differing = {role for role, overlap in self._splits.items() if overlap.differs()}
        for role in differing ^ self._differing:  # GD940 of that role's epochs is judged again (or not)
            self._dirty.update(key for key in self._epochs if key[0] == role)
        self._differing = differing
        held = self.found.get(codes.SPLIT_DIFFERS.code)
        if not differing or (held is not None and "evaluation samples" in held.message):
            return  # told already, with the leak (a split seen later may add the leak to it)
        refs = sorted({rd.ref for rd in self.ranks.values() if set(rd.splits) & differing}, key=_order)
        evals = [(rd.ref, s) for rd in self.ranks.values() for r, s in rd.splits.items() if is_eval(r)]
        trains = [(rd.ref, s) for rd in self.ranks.values() for r, s in rd.splits.items() if not is_eval(r)]
        leak = largest_leak(evals, trains)
        detail = ""
        if leak is not None:
            estimate, eref, tref, size, shift = leak
            count = f"{min(estimate, size)}" if shift == 0 else f"about {min(estimate, size)}"  # exact at shift 0
            detail = f"; {count} of {eref.label}'s {size} evaluation samples are in {tref.label}'s training split"
        roles = " and ".join(sorted(differing))
        message = f"{ranks_text(refs)} split the data set differently (their {roles} splits differ){detail}"
        hint = "Seed random_split the same on every rank: generator=torch.Generator().manual_seed(42)."
        self.found[codes.SPLIT_DIFFERS.code] = _verdict(codes.SPLIT_DIFFERS, message, hint, refs)


def _sampler_text(digests: Sequence[EpochDigest]) -> str:
    names = sorted({e.sampler for e in digests if e.sampler})
    if not names:
        return ""
    ranks = {e.sampler_rank for e in digests if e.sampler_rank is not None}
    text = f" (sampler: {', '.join(names)}"
    if len(ranks) == 1 and len([e for e in digests if e.sampler_rank is not None]) > 1:
        text += f", every one built with rank={ranks.pop()}"
    return text + ")"


def _verdict(code: Code, message: str | Figure, hint: str, refs: Sequence[RankRef]) -> Verdict:
    """A data verdict naming `refs`; `message` a Figure when the verdict has a number to tell over its span."""
    figure = message if isinstance(message, Figure) else None
    text = message.message(message.value) if isinstance(message, Figure) else message
    return Verdict(code.code, code.name, (), text, hint, figure=figure, ranks=tuple(sorted(refs, key=_order)))
