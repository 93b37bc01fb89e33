"""The bounded depth-first search that places one gate of a multi-group shape in one domain.

The placement order (`order_groups`: the rarest group first, both engines' instances of it
before the next), the steps it makes (`Plan`), and the search over candidate domains and
classes of interchangeable nodes (`Search`), with the caches a large `together` domain keeps
between searches; `count_gates` places gates one after another as allocation would. The why
and the bound (SEARCH_BUDGET) are in `groups.py`'s docstring. No I/O.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gate.reservations.groups_fleet import (
    Domains,
    Fleet,
    Layout,
    bound,
    domain_fit,
    engine_capacity,
    index_of,
    instances,
)
from gate.reservations.shapes import DomainFit, level_index

SEARCH_BUDGET = 10_000
PRUNE_FROM = 128  # nodes in a `together` domain: larger ones drop filled nodes between gates


def _count_vectors(sizes: Sequence[int], n: int) -> Iterator[tuple[int, ...]]:
    """Every way to draw `n` nodes from classes of these sizes, the most from the first
    classes first."""
    k = len(sizes)
    suffix = [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        suffix[i] = suffix[i + 1] + sizes[i]
    counts = [0] * k

    def rec(i: int, left: int) -> Iterator[tuple[int, ...]]:
        if left == 0:
            yield tuple(counts)
            return
        if i == k or suffix[i] < left:
            return
        for c in range(min(sizes[i], left), -1, -1):
            if suffix[i + 1] < left - c:
                break
            counts[i] = c
            yield from rec(i + 1, left - c)
        counts[i] = 0

    yield from rec(0, n)


class _OutOfBudget(Exception):
    pass


@dataclass
class HostClasses:
    """A host-level step's candidate nodes in their order, by class of interchangeable ones
    (free GPUs, signature); each class is tried once, through its first member."""

    nodes: list[int]
    order: dict[int, int] = field(default_factory=dict)  # node -> position in `nodes`
    cls_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    members: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # positions
    ranked: list[tuple[int, int]] = field(default_factory=list)  # (free, first member)

    def __post_init__(self) -> None:
        self.order = {x: i for i, x in enumerate(self.nodes)}

    def move(self, x: int, new: tuple[int, int] | None) -> None:
        """Node x now belongs to class `new` (None: no room for a worker)."""
        old = self.cls_of.pop(x, None)
        if old == new:
            if new is not None:
                self.cls_of[x] = new
            return
        at = self.order[x]
        if old is not None:
            ords = self.members[old]
            first = ords[0]
            del ords[bisect.bisect_left(ords, at)]
            if first == at:
                self.ranked.remove((old[0], x))
                if ords:
                    bisect.insort(self.ranked, (old[0], self.nodes[ords[0]]))
                else:
                    del self.members[old]
        if new is not None:
            self.cls_of[x] = new
            ords = self.members.setdefault(new, [])
            lead = ords[0] if ords else None
            bisect.insort(ords, at)
            if ords[0] != lead:
                if lead is not None:
                    self.ranked.remove((new[0], self.nodes[lead]))
                bisect.insort(self.ranked, (new[0], x))


# -- the placement order -------------------------------------------------------------------------


def order_groups(f: Fleet) -> None:
    """The placement order: most constrained in the inventory first (fewest domains that hold
    one, fewest instances, on the GPUs no other workload uses, whatever gates hold: so the
    order is the same for every allocation from this inventory), then most GPUs, most nodes,
    the order written."""
    width = range(len(f.groups))
    rare = f.scan.rarity.get(f.base)
    if rare is None:
        tally = [[0, 0] for _ in width]
        for members in f.pairs.values():
            for g in width:
                d, c = instances(f, members, g, f.usable)
                tally[g][0] += d
                tally[g][1] += c
        rare = f.scan.rarity[f.base] = [(d, c) for d, c in tally]
    f.order = sorted(width, key=lambda g: (*rare[g], -f.groups[g].gpus, -f.groups[g].nodes, g))
    f.plan = Plan.of(f)


@dataclass(frozen=True)
class Step:
    """One position of the search: a group of one engine, and how its rules stand there.
    Levels are indices into the fleet's levels, only those below `together` (inside one
    `together` domain the others hold by themselves)."""

    group: int
    engine: int
    gpn: int
    nodes: int
    host: bool  # the group's level is host: each candidate node is a domain of its own
    fixed: tuple[int, ...]  # connect rules an earlier group of this engine already placed
    unfixed: tuple[int, ...]  # connect rules this group places first (it fixes their domain)
    fixed_levels: tuple[int, ...]
    domain_levels: tuple[int, ...]  # the group's level, then its unfixed rules' levels
    unfixed_levels: tuple[int, ...]
    # The groups of this engine still to place under a rule this step fixes: (group, rule
    # level, GPUs per node, nodes), checked as soon as the rule's domain is chosen.
    peers: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def layout(self) -> Layout:
        return (self.group, self.fixed_levels, self.domain_levels)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    @classmethod
    def of(cls, f: Fleet) -> Plan:
        """Both engines' instances of the rarest group, then the next group's, and so on."""
        top = level_index(f.shape.pair_level)
        rules = [
            (c, {index_of(f, name) for name in rule.groups}, f.lvl(rule.level))
            for c, rule in enumerate(f.shape.connect)
            if level_index(rule.level) < top  # at or above `together`: holds by itself
        ]
        positions = [(g, r) for g in f.order for r in range(len(f.shape.roles))]
        steps = []
        for i, (g, r) in enumerate(positions):
            before = {h for h, e in positions[:i] if e == r}
            mine = [(c, li) for c, gs, li in rules if g in gs]
            fixed = [(c, li) for c, li in mine if any(gs & before for d, gs, _ in rules if d == c)]
            unfixed = [(c, li) for c, li in mine if (c, li) not in fixed]
            later = {h for h, e in positions[i + 1 :] if e == r}
            peers = tuple(
                (h, li, f.groups[h].gpus_per_node, f.groups[h].nodes)
                for c, li in unfixed
                for d, gs, _ in rules
                if d == c
                for h in sorted(gs & later)
            )
            grp = f.groups[g]
            below = grp.level != "host" and level_index(grp.level) < top
            own = (f.lvl(grp.level),) if below else ()
            steps.append(
                Step(
                    g,
                    r,
                    grp.gpus_per_node,
                    grp.nodes,
                    grp.level == "host" and top > 0,
                    tuple(c for c, _ in fixed),
                    tuple(c for c, _ in unfixed),
                    tuple(li for _, li in fixed),
                    own + tuple(li for _, li in unfixed),
                    tuple(li for _, li in unfixed),
                    peers,
                )
            )
        return cls(tuple(steps))


# -- the search ----------------------------------------------------------------------------------


@dataclass
class Search:
    """Depth-first placement of one gate in one `together` domain (see the module docstring)."""

    f: Fleet
    pair: str
    budget: int = 0
    chosen: list[list[int]] = field(default_factory=list)
    width: int = 0  # node sets tried per domain (0: all of them)
    keep: bool = False  # keep candidates across searches (large domains; see _ranked)

    def __post_init__(self) -> None:
        assert self.f.plan is not None
        self.keep = len(self.f.pairs[self.pair]) > PRUNE_FROM
        n = len(self.f.plan.steps)
        self.chosen = [[] for _ in range(n)]
        # One straight descent (each step examines at most every node and every domain of
        # the `together` domain once, and tries one set) is always allowed; SEARCH_BUDGET
        # bounds the backtracking.
        self.budget = SEARCH_BUDGET + n * (2 * len(self.f.pairs[self.pair]) + 1)

    def _bucket(self, step: Step) -> dict[tuple[str, ...], Domains]:
        """A step's candidates: by the values of its fixed connect rules, its domains, each
        with the group's eligible nodes that have room for one of its workers. Built once per
        domain and layout (both engines' steps share it), before the search moves anything:
        within one call free GPUs only fall (a search restores what it tries), so a node
        without room now never gets it back, and `prune` drops those a placed gate filled."""
        f = self.f
        got = f.buckets.get((self.pair, step.layout))
        if got is not None:
            return got
        fl, dl, bit, gpn = step.fixed_levels, step.domain_levels, 1 << step.group, step.gpn
        keys, mask, free = f.keys, f.mask, f.free
        out: dict[tuple[str, ...], Domains] = {}
        members = [x for x in f.pairs[self.pair] if mask[x] & bit and free[x] >= gpn]
        if not fl and not dl:
            out[()] = {(): members}
        else:
            for x in members:
                k = keys[x]
                doms = out.setdefault(tuple([k[j] for j in fl]), {})
                doms.setdefault(tuple([k[j] for j in dl]), []).append(x)
        n = step.nodes
        for doms in out.values():  # a domain short of nodes with room stays so in this call
            for dk in [dk for dk, xs in doms.items() if len(xs) < n]:
                del doms[dk]
        f.buckets[(self.pair, step.layout)] = out
        return out

    def prune(self) -> None:
        """After a gate is placed: drop the nodes it left without room from the candidates of
        the next search in this domain."""
        f = self.f
        assert f.plan is not None
        done: set[Layout] = set()
        touched = {x for chosen in self.chosen for x in chosen}
        for step in f.plan.steps:
            if step.layout in done:
                continue
            done.add(step.layout)
            bucket = f.buckets.get((self.pair, step.layout))
            if bucket is None:
                continue
            for x in touched:
                if f.free[x] >= step.gpn or not f.mask[x] & (1 << step.group):
                    continue
                k = f.keys[x]
                doms = bucket.get(tuple([k[j] for j in step.fixed_levels]))
                dk = tuple([k[j] for j in step.domain_levels])
                xs = doms.get(dk) if doms else None
                if doms is not None and xs is not None and x in xs:
                    xs.remove(x)
                    if len(xs) < step.nodes:
                        del doms[dk]

    def run(self) -> bool:
        assert self.f.plan is not None
        for step in self.f.plan.steps:
            self._bucket(step)  # from the committed free counts (see _bucket)
            for h, li, _, _ in step.peers:
                self._by_rule(h, li)
        steps = self.f.plan.steps
        try:
            # First only the best-fit node set of every candidate domain (which domain each
            # group goes to is the choice a greedy order gets wrong), then every node set.
            for self.width in (1, 0):
                if self._dfs(0, steps, [{} for _ in self.f.shape.roles]):
                    return True
        except _OutOfBudget:
            pass
        return False

    def _options(self, step: Step, doms: Domains, fixed: tuple[str, ...]) -> Iterator[list[int]]:
        """Node sets for this step, best fit first: candidate domains tightest first, and in
        each the ways of drawing from its classes of interchangeable nodes. Charges the
        budget one unit per candidate node examined."""
        n = step.nodes
        if step.host:
            # Every node is a domain of its own: one try per class of interchangeable nodes,
            # the tightest first.
            self._charge(sum(map(len, doms.values())))
            for x in self._hosts(step, doms, fixed):
                yield [x]
            return
        self._charge(len(doms))
        for xs in self._ranked(step, doms, fixed):
            self._charge(len(xs))
            if self.width:
                yield from itertools.islice(self._node_sets(xs, n), self.width)
            else:
                yield from self._node_sets(xs, n)

    def _hosts(self, step: Step, doms: Domains, fixed: tuple[str, ...]) -> list[int]:
        """A host-level step's candidates: the first node (in the candidates' order) of each
        class of interchangeable nodes with room (same free GPUs, same signature), tightest
        first. Kept across searches like `_ranked`: only nodes changed since are moved."""
        f, gpn = self.f, step.gpn
        free, sig = f.free, f.sig
        if not self.keep:  # a small domain: a fresh look costs less than keeping one
            firsts: dict[tuple[int, int], int] = {}
            sigs = f.sigs
            for xs in doms.values():
                for x in xs:
                    fx = free[x]
                    if fx >= gpn:
                        firsts.setdefault((fx, sigs[x] if sigs[x] >= 0 else sig(x)), x)
            return sorted(firsts.values(), key=lambda x: (free[x], x))
        key = (self.pair, step.layout, gpn, fixed)
        got = f.hosts.get(key)
        if got is None:
            st = HostClasses([x for xs in doms.values() for x in xs])
            for x in st.nodes:
                if free[x] >= gpn:
                    st.cls_of[x] = c = (free[x], sig(x))
                    st.members.setdefault(c, []).append(st.order[x])
            st.ranked = sorted((c[0], st.nodes[ords[0]]) for c, ords in st.members.items())
        else:
            seen, st = got
            for x in {x for x in f.changed[seen:] if x in st.order}:
                st.move(x, (free[x], sig(x)) if free[x] >= gpn else None)
        f.hosts[key] = (len(f.changed), st)
        return [x for _, x in st.ranked]

    def _ranked(self, step: Step, doms: Domains, fixed: tuple[str, ...]) -> list[list[int]]:
        """The step's candidate domains with room for the group (their nodes with room for a
        worker), the tightest first: fewest instances of the group fit, fewest free GPUs.
        On a large `together` domain (hundreds of candidates, a gate changes a handful of
        nodes) the ranking is kept per domain and layout across searches: only the domains
        of nodes whose free counts changed since the last call are ranked again."""
        f, gpn, n = self.f, step.gpn, step.nodes
        free = f.free

        def tightness(xs: list[int]) -> tuple[int, int, int]:
            slots = [free[x] // gpn for x in xs]
            fits = sum(slots) if n == 1 else engine_capacity(slots, n)
            return (fits, sum([free[x] for x in xs]), xs[0])

        def with_room(all_xs: list[int]) -> list[int] | None:
            if len(all_xs) < n:
                return None
            xs = [x for x in all_xs if free[x] >= gpn]
            return xs if len(xs) >= n else None

        if not self.keep:  # a small domain: a fresh look costs less than keeping one
            options = [xs for all_xs in doms.values() if (xs := with_room(all_xs))]
            if len(options) > 1:
                options.sort(key=tightness)
            return options
        key = (self.pair, step.layout, step.gpn, step.nodes, fixed)
        got = f.ranked.get(key)
        if got is None:
            out = {dk: (tightness(xs), xs) for dk, a in doms.items() if (xs := with_room(a))}
        else:
            seen, out = got
            dl, keys = step.domain_levels, f.keys
            for dk in {tuple([keys[x][j] for j in dl]) for x in f.changed[seen:]}:
                all_xs = doms.get(dk)
                xs = with_room(all_xs) if all_xs is not None else None
                if xs is None:
                    out.pop(dk, None)
                else:
                    out[dk] = (tightness(xs), xs)
        f.ranked[key] = (len(f.changed), out)
        return [xs for _, xs in sorted(out.values())]

    def _charge(self, units: int) -> None:
        self.budget -= units
        if self.budget < 0:
            raise _OutOfBudget

    def _dfs(self, i: int, steps: tuple[Step, ...], values: list[dict[int, str]]) -> bool:
        if i == len(steps):
            return True
        f, step = self.f, steps[i]
        r, gpn = step.engine, step.gpn
        mine = values[r]
        fixed = tuple([mine[c] for c in step.fixed])
        doms = self._bucket(step).get(fixed, {})
        free, keys, changed, keep = f.free, f.keys, f.changed, self.keep
        for chosen in self._options(step, doms, fixed):
            self._charge(1)
            for x in chosen:
                free[x] -= gpn
            if keep:
                changed.extend(chosen)
            if step.unfixed:
                lead = keys[chosen[0]]
                for c, li in zip(step.unfixed, step.unfixed_levels, strict=True):
                    mine[c] = lead[li]
            if self._peers_fit(step, keys[chosen[0]]) and self._dfs(i + 1, steps, values):
                self.chosen[i] = chosen
                return True
            for c in step.unfixed:
                del mine[c]
            for x in chosen:
                free[x] += gpn
            if keep:
                changed.extend(chosen)
        return False

    def _peers_fit(self, step: Step, lead: tuple[str, ...]) -> bool:
        """The domain a rule was just fixed to still has, for each group of the same engine
        still to place under it, enough nodes with room for one of its workers (a forward
        check: a greedy choice that strands a connected group is left at once)."""
        free = self.f.free
        for h, li, gpn, n in step.peers:
            xs = self._by_rule(h, li).get(lead[li], ())
            self._charge(len(xs))
            if sum(1 for x in xs if free[x] >= gpn) < n:
                return False
        return True

    def _by_rule(self, h: int, li: int) -> dict[str, list[int]]:
        """Group h's nodes with room in this `together` domain, by their domain at level li
        (built with the buckets, from the committed free counts)."""
        f = self.f
        got = f.by_rule.get((self.pair, h, li))
        if got is None:
            gpn, bit, free, keys, mask = f.groups[h].gpus_per_node, 1 << h, f.free, f.keys, f.mask
            got = {}
            for x in f.pairs[self.pair]:
                if mask[x] & bit and free[x] >= gpn:
                    got.setdefault(keys[x][li], []).append(x)
            f.by_rule[(self.pair, h, li)] = got
        return got

    def _node_sets(self, xs: list[int], n: int) -> Iterator[list[int]]:
        """Node sets of size n from xs, one per way of drawing from classes of
        interchangeable nodes: the best fit first (see the module docstring)."""
        f = self.f
        classes: dict[tuple[int, int], list[int]] = {}
        free, sigs, sig = f.free, f.sigs, f.sig
        for x in xs:
            classes.setdefault((free[x], sigs[x] if sigs[x] >= 0 else sig(x)), []).append(x)
        ordered = sorted(classes.values(), key=lambda c: (f.free[c[0]], c[0]))
        if n == 1:
            for c in ordered:
                yield [c[0]]
            return
        sizes = [len(c) for c in ordered]
        roomy: list[int] = []
        left = n
        for k in range(len(sizes) - 1, -1, -1):
            take = min(sizes[k], left)
            roomy.append(take)
            left -= take
        first = tuple(reversed(roomy + [0] * (len(sizes) - len(roomy))))
        yield _draw(ordered, first)
        for counts in _count_vectors(sizes, n):
            if counts != first:
                yield _draw(ordered, counts)


def _draw(classes: list[list[int]], counts: tuple[int, ...]) -> list[int]:
    """The nodes a draw takes, the roomiest class first (its first node leads the group)."""
    out: list[int] = []
    for c, k in zip(reversed(classes), reversed(counts), strict=True):
        out.extend(c[:k])
    return out


# -- gates one after another ---------------------------------------------------------------------


def count_gates(f: Fleet, headroom: bool = True) -> dict[str, DomainFit]:
    """Gates per `together` domain, placed one after another as allocate() would place them
    (mutates f.free), up to the domain's bound: a further search could only fail."""
    out: dict[str, DomainFit] = {}
    roles = len(f.shape.roles)
    for p in f.pairs:
        fit = domain_fit(f, p, 0)
        ub, gates = bound(f, p, headroom), 0
        while gates < ub:
            search = Search(f, p)
            if not search.run():
                break
            if len(f.pairs[p]) > PRUNE_FROM:
                search.prune()
            gates += 1
        out[p] = fit._replace(gates=gates, engines=gates * roles) if gates else fit
    return out
