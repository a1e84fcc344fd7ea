"""The DataBook of gpudoctor/watch/data.py as of 5552faf (before issue 22's incremental judging), kept word for
word as the oracle: tests/watch/test_data_incremental.py asserts that today's DataBook gives the same verdicts
after every feed, and benchmarks/data_verdicts.py measures both. Only the pure helpers it shares with today's
module (unchanged since) are imported. Do not edit: it is the behaviour the new code must keep. One change
since, on purpose, in `add` (which process holds a rank): a newer process that says nothing but hello while
another holds the rank does not take it until it sends more (a DataLoader worker started with spawn says
hello as it exits, every epoch, and took the rank from its rank: issue 22, review 5 F1)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpudoctor.engine.codes import Code
from gpudoctor.watch import data_codes as codes
from gpudoctor.watch.analysis import Figure, RankRef, Verdict
from gpudoctor.watch.data import (
    KEEP_EPOCHS,
    MIN_EVIDENCE,
    MIN_PREFIX,
    _order,
    _sampler_text,
    _verdict,
    filtered,
    is_eval,
    ranks_text,
)
from gpudoctor.watch.data_model import DataReading, EpochDigest, Hello, SplitDigest
from gpudoctor.watch.model import plural
from gpudoctor.watch.thresholds import Thresholds


@dataclass
class RankData:
    """One rank's data over the run."""

    ref: RankRef
    hello: Hello | None = None
    epochs: dict[str, dict[int, EpochDigest]] = field(default_factory=dict)  # role -> epoch -> digest
    splits: dict[str, SplitDigest] = field(default_factory=dict)

    def add(self, r: DataReading) -> None:
        self.hello = r.hello or self.hello
        for e in r.epochs:
            kept = self.epochs.setdefault(e.role, {})
            old = kept.get(e.epoch)
            if old is not None and old.final and not e.final:
                continue  # a late partial digest never replaces a complete one
            kept[e.epoch] = e
            later = sorted(n for n in kept if n != min(kept))
            for n in later[:-KEEP_EPOCHS]:
                del kept[n]
        for s in r.splits:
            self.splits[s.role] = s


class DataBook:
    """The data verdicts of a run: feed every sample's data readings, ask for the verdicts."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.ranks: dict[tuple[int | None, int], RankData] = {}
        self.pending: dict[int, DataReading] = {}
        self.found: dict[str, Verdict] = {}  # code -> the first verdict of that code, held to the end
        self._changed = False

    def add(self, readings: Iterable[DataReading]) -> None:
        for r in readings:
            key = r.key
            rd = self.ranks.get(key)
            if rd is None and r.rank is not None and any(k[0] == r.rank for k in self.ranks):
                # Another process holds the rank: one that says nothing but hello (a DataLoader worker as
                # it exits, or the rank's next process) does not take it until it sends more.
                hello = self.pending.pop(r.rank, None)
                if not (r.epochs or r.splits or r.loss or r.loader):
                    self.pending[r.rank] = r
                    continue
                if hello is not None and hello.pid == r.pid and r.hello is None:
                    r = replace(r, hello=hello.hello)
            if rd is None:
                if r.rank is not None:  # a new process for a rank seen before (a restarted job): the old is done
                    for old in [k for k in self.ranks if k[0] == r.rank]:
                        del self.ranks[old]
                rd = self.ranks[key] = RankData(RankRef(r.rank, r.pid))
            rd.add(r)
            self._changed = self._changed or bool(r.epochs or r.splits)

    def hellos(self) -> dict[tuple[int | None, int], Hello]:
        return {k: rd.hello for k, rd in self.ranks.items() if rd.hello is not None}

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

    def _widen(self, v: Verdict) -> None:
        """Hold `v`, or let it replace the held verdict of its code when it names more ranks: under load
        some ranks show a mistake samples before the others (it never narrows)."""
        held = self.found.get(v.code)
        if held is None or set(v.ranks) > set(held.ranks):
            self.found[v.code] = v

    # -- judging -----------------------------------------------------------------------------------------
    def _by_epoch(self) -> dict[tuple[str, int], list[tuple[RankRef, EpochDigest]]]:
        out: dict[tuple[str, int], list[tuple[RankRef, EpochDigest]]] = {}
        for rd in self.ranks.values():
            for role, epochs in rd.epochs.items():
                for n, e in epochs.items():
                    out.setdefault((role, n), []).append((rd.ref, e))
        return out

    def _judge(self) -> None:
        differing = self._splits()
        by_epoch = self._by_epoch()
        for (role, number), digests in sorted(by_epoch.items()):
            digests.sort(key=lambda x: _order(x[0]))
            if is_eval(role):
                self._padding(role, number, digests)
            else:
                if role not in differing:
                    self._not_sharded(role, number, digests)
                self._uneven(role, number, digests)
        self._same_order()

    def _not_sharded(self, role: str, number: int, digests: list[tuple[RankRef, EpochDigest]]) -> None:
        """GD940: ranks that read the same first indices, or of whose sample a share was read by another rank.
        Judged again as more ranks have read enough, until it names every rank."""
        if len(digests) < 2 or self._names_all(codes.DATA_NOT_SHARDED):
            return
        readable = [(ref, e) for ref, e in digests if not e.unreadable]
        same: dict[tuple[int, ...], list[RankRef]] = {}
        for ref, e in readable:
            if len(e.prefix) >= MIN_PREFIX or (e.final and e.prefix and len(e.prefix) == e.n):
                same.setdefault(e.prefix[: max(MIN_PREFIX, 1)], []).append(ref)
        twins = [refs for refs in same.values() if len(refs) > 1]
        shift = max((e.shift for _, e in readable), default=0)
        sets = {ref: filtered(e.kept, shift) for ref, e in readable}
        count: dict[int, int] = {}
        for s in sets.values():
            for i in s:
                count[i] = count.get(i, 0) + 1
        # DistributedSampler reads at most world - 1 indices twice (its padding): more shared is proof.
        padding = max([len(digests) - 1] + [e.replicas - 1 for _, e in digests if e.replicas])
        shares = {}
        for ref, e in readable:
            s = sets[ref]
            shared = sum(1 for i in s if count[i] > 1)
            if shared > padding and (len(s) >= MIN_EVIDENCE or e.final):
                shares[ref] = shared / len(s)
        named = sorted(
            {ref for refs in twins for ref in refs} | {r for r, x in shares.items() if x >= self.th.overlap_share},
            key=_order,
        )
        if len(named) < 2:
            return
        seen = [shares[r] for r in named if r in shares]
        share = 100 * statistics.mean(seen) if seen else 100.0
        facts = [e for ref, e in digests if ref in named]
        how = "read the same first samples in the same order" if twins else "read the same samples"
        template = (
            f"{ranks_text(named)} {how} in {role} epoch {number}: {{}}% of their sampled indices were also read by "
            f"another rank{_sampler_text(facts)}"
        )
        figure = Figure(share, template, unit="% shared")
        hint = "Pass a DistributedSampler to the DataLoader (sampler=), or shard the data per rank."
        self._widen(_verdict(codes.DATA_NOT_SHARDED, figure, hint, named))

    def _uneven(self, role: str, number: int, digests: list[tuple[RankRef, EpochDigest]]) -> None:
        """GD944: a rank ended the epoch with fewer batches than another rank has run in it. Judged again as
        more ranks' loaders are known, until it names every rank."""
        if len(digests) < 2 or self._names_all(codes.UNEVEN_SHARDS):
            return
        planned = [e.expected for _, e in digests]
        if None not in planned and len(set(planned)) > 1:  # len(loader) differs: known as the epoch starts
            counts = [(ref, e.expected or 0) for ref, e in digests]
            how = "the ranks' loaders give different numbers of batches"
        else:  # counted: a rank ended the epoch with fewer batches than another has run in it
            ended = [e.batches for _, e in digests if e.final]
            counts = [(ref, e.batches) for ref, e in digests]
            if not ended or max(n for _, n in counts) <= min(ended):
                return
            so_far = "" if all(e.final for _, e in digests) else " so far"
            how = f"the ranks ran different numbers of batches{so_far}"
        most, fewest = max(n for _, n in counts), min(n for _, n in counts)
        shown = ", ".join(f"{ref.label} {n}" for ref, n in counts)
        message = (
            f"{role} epoch {number}: {how} ({shown}): the rank with {most} waits in collectives the ranks with "
            f"{fewest} never join"
        )
        hint = "Give every rank the same number of batches (DistributedSampler, drop_last) or use model.join()."
        self._widen(_verdict(codes.UNEVEN_SHARDS, message, hint, [ref for ref, _ in digests]))

    def _padding(self, role: str, number: int, digests: list[tuple[RankRef, EpochDigest]]) -> None:
        """GD943: an evaluation epoch whose ranks together read more samples than the data set holds, by
        less than one per rank (DistributedSampler's padding, not every rank reading everything)."""
        if len(digests) < 2 or not all(e.final for _, e in digests) or codes.EVAL_PADDING.code in self.found:
            return
        sizes = {e.len for _, e in digests}
        if len(sizes) != 1 or None in sizes or any(e.drop_last for _, e in digests):
            return
        size = sizes.pop()
        assert size is not None
        total = sum(e.n for _, e in digests)
        extra = total - size
        if not 0 < extra < len(digests):
            return
        sampler = _sampler_text([e for _, e in digests])
        message = (
            f"{role} epoch {number}: the {len(digests)} ranks read {total} samples of a {size}-sample data set: "
            f"{plural(extra, 'sample')} padded by the sampler{sampler}, counted twice in a metric reduced over ranks"
        )
        hint = "Evaluate the remainder on its own (imagenet's drop_last=True sampler plus a remainder loader)."
        self._hold(_verdict(codes.EVAL_PADDING, message, hint, [ref for ref, _ in digests]))

    def _same_order(self) -> None:
        """GD941: a rank whose later epoch starts with the same (shuffled) indices as its first. Judged again
        as more ranks reach their second epoch: under load one rank gets there well before the others, and the
        verdict widens to name each rank that repeats its order (it never narrows)."""
        code = codes.SAME_ORDER_EVERY_EPOCH.code
        for role in sorted({role for rd in self.ranks.values() for role in rd.epochs}):
            held = self.found.get(code)
            if held is not None and len(held.ranks) == len(self.ranks):
                return
            named: list[RankRef] = []
            stuck: set[int] = set()
            later = same = 0
            for rd in self.ranks.values():
                epochs = rd.epochs.get(role, {})
                if len(epochs) < 2:
                    continue
                first = epochs[min(epochs)]
                for n, e in sorted(epochs.items()):
                    if n == min(epochs) or e.unreadable or first.unreadable:
                        continue
                    m = min(len(first.prefix), len(e.prefix))
                    enough = m >= MIN_PREFIX or (e.final and first.final and m == e.n == first.n and m > 1)
                    shuffled = not (first.ascending and e.ascending) and first.shuffle is not False
                    if enough and shuffled and first.prefix[:m] == e.prefix[:m]:
                        named.append(rd.ref)
                        later, same = max(later, n), max(same, m)
                        if e.sampler_epoch is not None and e.sampler_epoch == first.sampler_epoch:
                            stuck.add(e.sampler_epoch)
                        break
            if not named or (held is not None and set(named) <= set(held.ranks)):
                continue
            named.sort(key=_order)
            why = f"; the sampler's epoch stayed {min(stuck)}: set_epoch() is not called" if stuck else ""
            message = (
                f"{ranks_text(named)} read {role} epoch {later} in the same order as epoch 0 (the first "
                f"{same} indices identical){why}"
            )
            hint = "Call sampler.set_epoch(epoch) at the start of every epoch, before iterating the loader."
            self.found[code] = _verdict(codes.SAME_ORDER_EVERY_EPOCH, message, hint, named)

    def _splits(self) -> set[str]:
        """GD942: ranks whose Subsets of one data set differ but overlap. Returns the roles concerned."""
        differing: set[str] = set()
        roles = {role for rd in self.ranks.values() for role in rd.splits}
        for role in sorted(roles):
            have = sorted(
                ((rd.ref, rd.splits[role]) for rd in self.ranks.values() if role in rd.splits),
                key=lambda x: _order(x[0]),
            )
            if len(have) < 2 or len({s.base for _, s in have}) != 1 or len({s.hash for _, s in have}) == 1:
                continue
            shift = max(s.shift for _, s in have)
            sets = [(ref, filtered(s.kept, shift), s) for ref, s in have]
            overlap = any(
                a & b and (a != b or sa.n != sb.n) for i, (_, a, sa) in enumerate(sets) for _, b, sb in sets[i + 1 :]
            )
            if overlap:
                differing.add(role)
        held = self.found.get(codes.SPLIT_DIFFERS.code)
        if not differing or (held is not None and "evaluation samples" in held.message):
            return differing  # told already, with the leak (a split seen later may add the leak to it)
        refs = sorted({rd.ref for rd in self.ranks.values() if set(rd.splits) & differing}, key=_order)
        leak = self._leak()
        detail = "" if leak is None else f"; {leak}"
        roles = " and ".join(sorted(differing))
        message = f"{ranks_text(refs)} split the data set differently (their {roles} splits differ){detail}"
        hint = "Seed random_split the same on every rank: generator=torch.Generator().manual_seed(42)."
        self.found[codes.SPLIT_DIFFERS.code] = _verdict(codes.SPLIT_DIFFERS, message, hint, refs)
        return differing

    def _leak(self) -> str | None:
        """How many of one rank's evaluation samples another rank's training split holds (the most found)."""
        evals = [(rd.ref, s) for rd in self.ranks.values() for r, s in rd.splits.items() if is_eval(r)]
        trains = [(rd.ref, s) for rd in self.ranks.values() for r, s in rd.splits.items() if not is_eval(r)]
        best: tuple[int, RankRef, RankRef, int, int] | None = None
        for eref, es in evals:
            for tref, ts in trains:
                if tref == eref or es.base != ts.base:
                    continue
                shift = max(es.shift, ts.shift)
                common = len(filtered(es.kept, shift) & filtered(ts.kept, shift))
                estimate = common * (1 << shift)
                if common and (best is None or estimate > best[0]):
                    best = (estimate, eref, tref, es.n, shift)
        if best is None:
            return None
        estimate, eref, tref, size, shift = best
        count = f"{min(estimate, size)}" if shift == 0 else f"about {min(estimate, size)}"  # exact at shift 0
        return f"{count} of {eref.label}'s {size} evaluation samples are in {tref.label}'s training split"
