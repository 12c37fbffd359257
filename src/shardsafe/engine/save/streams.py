"""The streams of a save: each output file's image, its transform, and its sinks.

A save writes this rank's data files (``prep.plans``) and block file (``prep.coded``);
each of its replicas mirrors some of them and may have files of its own. Each of these
images is a *stream*: its units (what the feed fills), its transform (``Checksum`` for
a data file, ``Compress`` for a block file) and its *targets*, one per owner that
wants the bytes (the save; every replica mirroring the file), each opening its sinks.
An owner fails on its own: a replica whose sink fails does not stop the save, and a
save whose own file fails still feeds the replicas that mirror it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...plan.layout import FilePlan, block_file_name
from .assembly import Output, block_layout
from .feeds import Unit
from .prepare import PreparedSave
from .replica import MirrorSink, PreparedReplica
from .sinks import Sink, open_sink
from .sources import Sources
from .transforms import Checksum, Compress, Transform
from .units import BLOCK_SIZE, FileUnits

Opener = Callable[[str, int, bool], Sink]
"""Opens a sink: ``(file name, size, exact)`` (``exact`` False: ``size`` is an upper bound)."""


class Owner:
    """Who a group of sinks writes for: the save, or one of its replicas.

    Attributes:
        replica: The replica (None: the save itself).
        error: Its first failure (it gets no more bytes once failed).
        inflight: Writes of its sinks not finished yet (guarded by the pipeline's lock).
    """

    def __init__(self, replica: PreparedReplica | None = None) -> None:
        self.replica = replica
        self.error: BaseException | None = None
        self.inflight = 0

    @property
    def alive(self) -> bool:
        return self.error is None

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error


@dataclass(slots=True, eq=False)
class Outlet:
    """One owner's file of a stream, and its sinks (one per part; data files have one)."""

    owner: Owner
    opener: Opener
    sinks: dict[int, Sink] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Stream:
    """One image the feed fills (see the module docstring).

    Attributes:
        units: The image cut into units.
        transform: What each unit goes through (``Checksum`` for a data file,
            ``Compress`` for a block file).
        targets: The owners' files.
        name_of: The file name of part ``k`` (a data file is its one part 0).
    """

    units: FileUnits
    transform: Transform
    targets: list[Outlet]
    name_of: Callable[[int], str]
    _sources: Sources | None = None

    @property
    def sources(self) -> Sources:
        """Where the items' bytes are (found on first use, by the feed)."""
        if self._sources is None:
            self._sources = Sources(self.units.plan)
        return self._sources

    @property
    def coded(self) -> bool:
        """Whether its file holds the transform's output (coded blocks), not the units."""
        return self.transform.coded

    def live(self) -> bool:
        """Whether any owner still wants this stream's bytes."""
        return any(t.owner.alive for t in self.targets)


def opener_of(prep: PreparedSave) -> Opener:
    """Opens files in ``prep``'s working directory."""
    return lambda name, size, exact: open_sink(prep.storage, prep.path_of(name), size, exact=exact)


def _mirror(r: PreparedReplica, plan: FilePlan, save_plan: FilePlan) -> Opener:
    return lambda name, size, exact: MirrorSink(r.prep.storage, r.prep.path_of(plan.name), plan, save_plan)


def build_streams(prep: PreparedSave, replicas: list[PreparedReplica], unit_size: int, block_unit: int,
                  window: int, output: Callable[[list[Outlet]], Output],
                  release: Callable[[Unit], None]) -> tuple[list[Stream], Owner, list[Owner]]:
    """The streams of ``prep`` and its replicas: the save's data files, its block file,
    then each replica's own files; and the owners (the save's, then one per replica).

    Data files are cut into units of ``unit_size``, block files into units of
    ``block_unit`` (a multiple of the checksum block); ``window``: blocks coded at once.
    A block file's ``Compress`` writes through ``output(targets)`` and gives its units
    back with ``release``.
    """
    save = Owner()
    owners = [Owner(r) for r in replicas]
    rank = prep.comm.rank
    streams: list[Stream] = []

    def data(plan: FilePlan, targets: list[Outlet]) -> Stream:
        units = FileUnits(plan, unit_size, BLOCK_SIZE)
        return Stream(units, Checksum(units), targets, lambda k, name=plan.name: name)

    def block(plan: FilePlan, targets: list[Outlet], name_of: Callable[[int], str]) -> Stream:
        units = FileUnits(block_layout(plan.name, plan.items, block_unit), block_unit, BLOCK_SIZE)
        assert prep.compression is not None
        return Stream(units, Compress(units, prep.compression, window, output(targets), name_of, release),
                      targets, name_of)

    for j, plan in enumerate(prep.plans):
        targets = [Outlet(save, opener_of(prep))]
        for r, o in zip(replicas, owners):
            if j in r.mirrors:
                targets.append(Outlet(o, _mirror(r, r.prep.plans[r.mirrors[j]], plan)))
        streams.append(data(plan, targets))
    for j, plan in enumerate(prep.coded):
        targets = [Outlet(save, opener_of(prep))]
        targets += [Outlet(o, opener_of(r.prep)) for r, o in zip(replicas, owners) if j in r.coded_mirrors]
        streams.append(block(plan, targets, lambda k: block_file_name(rank, k)))
    for r, o in zip(replicas, owners):
        streams += [data(plan, [Outlet(o, opener_of(r.prep))]) for plan in r.own_plans()]
        streams += [block(plan, [Outlet(o, opener_of(r.prep))], r.own_block_name) for plan in r.own_coded()]
    return streams, save, owners


__all__ = ["Owner", "Stream", "Outlet", "build_streams", "opener_of"]
