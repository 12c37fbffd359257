"""The save pipeline, in phases that sync, async and distributed saves share.

    (a) flatten   state -> structure tree + tensor items           (caller thread)
    (b) plan      which items this rank writes, file layouts,
                  transaction (token agreed through ``comm``)       (caller thread)
    (c) stage     copy into host buffers (async) or bounce per unit (sync)
    (d) write     checksum + write every unit, fsync each file      (I/O pool)
    (e) commit    gather chunk entries; the coordinator publishes the index

Collectives go through a ``comm.Comm`` (``SingleProcessComm`` for world size 1). With
more than one rank, ``engine.plan_exchange`` supplies phase (b) (a planning collective
on the caller's thread: who writes what, the transaction token) and
``engine.two_phase_commit`` the store-only begin/commit/abort that may run on a
background thread (bounded by ``timeout``). What the phases hand each other,
``PreparedSave``, and the index built from it live in ``engine.prepared``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import knobs
from .._collector import paused
from ..comm import Comm, ExternalRank, get_comm
from ..plan.flatten import TensorItem, flatten
from ..plan.layout import FilePlan, block_file_name, data_file_name, plan_file
from ..plan.jax_shards import write_items
from ..plan.localize import localize
from ..storage import Deadline, storage_for
from . import commit, plan_exchange, two_phase_commit
from .block_writer import BlockFileWrite
from .copies import PreparedCopy, commit_copy, fail_copy
from .entries import CodedFile, Entries
from .incremental import Baseline
from .writer import FileWrite
from .prepared import BLOCK_SIZE, PreparedSave, build_index, check_metadata, local_entries, split_coded


def prepare(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
            metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
            comm: Comm | None = None, timeout: float | None = None,
            baseline: Baseline | None = None, compression: str | None = None) -> PreparedSave:
    """Phases (a) and (b): flattens ``state`` and plans the save; writes nothing.

    With ``compression`` (already checked by ``format.codec.check_compression``), this
    rank's larger items are planned into a block file (``prepared.split_coded``).

    With ``comm`` of more than one rank (default: the initialised torch.distributed
    world, if any) this is a collective call: every rank must make it. With a
    ``baseline`` (incremental saves) the chunks this rank would write are hashed, and
    those unchanged since the baseline's save are referenced instead of written (a
    compressed one in its block file, with its coding); only the written items are coded.

    Raises:
        TypeError: a value cannot be saved (the message names its key path).
        CheckpointError: the path holds something that must not be overwritten, or
            (collective saves) another rank failed to prepare.
    """
    with paused():
        return _prepare(state, path, overwrite=overwrite, metadata=metadata,
                        storage_options=storage_options, comm=comm or get_comm(), timeout=timeout,
                        baseline=baseline, compression=compression)


def _prepare(state: Mapping[str, Any], path: str, *, overwrite: bool, metadata: Mapping[str, Any] | None,
             storage_options: dict | None, comm: Comm, timeout: float | None,
             baseline: Baseline | None, compression: str | None) -> PreparedSave:
    storage, spath = storage_for(path, storage_options,
                                 deadline=Deadline.for_call(timeout, comm.rank, f"save to {path}"))
    md = dict(metadata or {})
    if comm.world_size > 1:
        wait = knobs.timeout() if timeout is None else float(timeout)
        p = plan_exchange.plan_collective(state, storage, spath, comm, overwrite=overwrite,
                                          metadata=md, timeout=wait)
        split = baseline.split(p.mine, spath) if baseline is not None else None
        plain, coded = split_coded(split.write if split is not None else p.mine, compression)
        return PreparedSave(storage, p.txn, p.tree, p.items, [plan_file(data_file_name(comm.rank), plain)],
                            md, comm, comm.channel(p.token), wait, baseline=baseline, split=split,
                            compression=compression, coded=_block_plans(comm.rank, coded))
    tree, items = flatten(state)
    localize(items, comm.group_rank)  # DTensors on a one-rank mesh: their local tensor
    writes = write_items(items)  # jax.Arrays: the shards this process writes
    check_metadata(md)
    txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=uuid.uuid4().hex[:16])
    split = baseline.split(writes, spath) if baseline is not None else None
    plain, coded = split_coded(split.write if split is not None else writes, compression)
    plans = [plan_file(data_file_name(comm.rank), plain)]
    return PreparedSave(storage, txn, tree, items, plans, md, comm, baseline=baseline, split=split,
                        compression=compression, coded=_block_plans(comm.rank, coded))


def prepare_part(items: Sequence[TensorItem], txn: commit.Transaction, comm: ExternalRank,
                 compression: str | None = None) -> PreparedSave:
    """Phase (b) for one rank of a save that another system plans and commits.

    ``shardsafe.dcp`` drives the engine this way: DCP's planner decides which rank writes
    which ``items`` (their ids index the tensor table the coordinator builds), every rank
    writes them into ``txn``'s working directory with ``Checkpointer.write_part``, and the
    coordinator publishes the index from every rank's entries with ``commit_parts``.
    """
    plain, coded = split_coded(items, compression)
    return PreparedSave(txn.storage, txn, {"t": "dict", "k": [], "v": []}, list(items),
                        [plan_file(data_file_name(comm.rank), plain)], {}, comm,
                        compression=compression, coded=_block_plans(comm.rank, coded))


def commit_parts(txn: commit.Transaction, tree: dict[str, Any], items: Sequence[TensorItem],
                 parts: Sequence[Entries], metadata: Mapping[str, Any], world_size: int) -> None:
    """Phase (e) of such a save: the index from every rank's entries, published in ``txn``.

    ``items`` is the whole tensor table (the chunks of ``parts`` must cover each exactly);
    ``tree`` the structure tree pointing into it.

    Raises:
        CheckpointError: the parts do not hold exactly each tensor's elements.
    """
    prep = PreparedSave(txn.storage, txn, tree, list(items), [], dict(metadata), ExternalRank(0, world_size))
    commit.finish(txn, build_index(prep, parts))


def _block_plans(rank: int, items: Sequence[TensorItem]) -> list[FilePlan]:
    """The block file of this rank's compressed items (none without any)."""
    return [plan_file(block_file_name(rank), items)] if items else []


def begin(prep: PreparedSave) -> None:
    """Creates the working directory (coordinator) before any rank writes into it."""
    if prep.channel is not None:
        two_phase_commit.begin(prep)
    else:
        commit.begin(prep.txn)


def commit_save(prep: PreparedSave, sums: Sequence[list[list[int]]],
                coded: Sequence[CodedFile] = ()) -> None:
    """Phase (e): the coordinator publishes the index once every rank's files are durable.

    ``sums``: the block checksums of each of ``prep.plans``; ``coded``: what each block
    file written for ``prep.coded`` holds.

    Collective saves use the store-only two-phase commit of ``engine.two_phase_commit``
    (safe on a background thread).

    Raises:
        CheckpointError: the commit failed (collective saves: on every rank).
        CheckpointTimeoutError: another rank did not answer within the timeout.
    """
    with paused():
        if prep.channel is None:
            commit.finish(prep.txn, build_index(prep, [local_entries(prep, sums, coded)]))
        else:
            two_phase_commit.commit_save(prep, local_entries(prep, sums, coded))
    if prep.baseline is not None and prep.split is not None:  # committed: the next save compares with it
        prep.baseline.advance(prep.txn.final, prep.plans, sums, prep.split, prep.comm.rank, coded)


def abort(prep: PreparedSave, error: BaseException | None = None) -> None:
    """Removes what a failed save wrote (never a committed checkpoint); logs cleanup errors.

    Called while another error propagates, so a failure to clean up is logged rather
    than raised over the error that matters. In a collective save it also tells the
    other ranks (``error`` says why), so nothing commits and nobody waits for this rank.
    """
    if prep.channel is not None:
        two_phase_commit.abort(prep, error)
    if prep.comm.rank == 0:
        commit.abort_quietly(prep.txn)


def abort_all(prep: PreparedSave, writes: Sequence[Any], copies: Sequence[PreparedCopy],
              error: BaseException) -> None:
    """After a failure: stops every write (the save's and the copies'), removes what the
    save wrote (``abort``) and fails every copy not settled yet."""
    for w in writes:
        w.cancel()
    abort(prep, error)
    for c in copies:
        if not c.handle.done():
            fail_copy(c, error)


def block_file_write(prep: PreparedSave, plan: FilePlan, *, name_of: Callable[[int], str] | None = None,
                     **source: Any) -> BlockFileWrite:
    """The writer of the block files of ``plan`` (one of ``prep.coded``), named
    ``data-r<rank>-<part>.blocks`` unless ``name_of`` names them; ``source``: ``staged=``
    and ``nunits=``, or ``sources=``, and ``mirrors=``."""
    assert prep.compression is not None  # prep.coded is empty without compression
    return BlockFileWrite(plan, prep.storage, prep.path_of,
                          name_of or (lambda part: block_file_name(prep.comm.rank, part)),
                          prep.compression, BLOCK_SIZE, **source)


def finish_all(prep: PreparedSave, writes: Sequence[Any], copies: Sequence[PreparedCopy] = (),
               copy_writes: Sequence[Sequence[Any]] = ()) -> None:
    """Phase (e) after the writes: finishes every write, commits each copy, then the save.

    ``writes`` lists the save's writes (as for ``finish_writes``), ``copy_writes`` the
    same for each copy's own files. With copies, the save's writes are finished on a
    helper thread while each copy commits as soon as its own files and its mirrors are
    durable (a mirror is done before the save's own file is synced or uploaded: a copy
    never waits for slow storage). Every write is finished even after another failed,
    since a copy needs its mirrors and its own writes. Each copy commits or fails on its
    own (its handle says which); the save commits last, possibly waiting for other ranks.

    Raises:
        BaseException: the first failure of the save's writes, or of its commit.
    """
    box: dict[str, Any] = {"error": RuntimeError("the save's writes were not finished")}

    def finish_save() -> None:
        try:
            box["results"], box["error"] = _finish(writes)
        except BaseException as e:  # noqa: BLE001 - raised below; the mirrors must not wait for it
            box["error"] = e
            for w in writes:
                w.cancel()

    helper = threading.Thread(target=finish_save, name="shardsafe-finish") if copies else None
    if helper is not None:
        helper.start()
    try:
        for copy, own in zip(copies, copy_writes):
            _finish_copy(copy, own)
    finally:
        if helper is not None:
            helper.join()
        else:
            finish_save()
    if box["error"] is not None:
        raise box["error"]
    commit_save(prep, *_split(prep, box["results"]))


def _finish_copy(copy: PreparedCopy, own: Sequence[Any]) -> None:
    """Finishes a copy's own writes and commits it (``copies.commit_copy``), or fails it."""
    if copy.error is not None:
        for w in own:
            w.cancel()
        fail_copy(copy, copy.error)
        return
    got, error = _finish(own)
    if error is not None:
        fail_copy(copy, error)
    else:
        commit_copy(copy, got)


def finish_writes(prep: PreparedSave, writes: Sequence[Any]) -> tuple[list[list[list[int]]], list[CodedFile]]:
    """Finishes every write of this rank: the block checksums of each of ``prep.plans``, and
    what the block files of ``prep.coded`` hold.

    ``writes`` lists the ``FileWrite`` of each of ``prep.plans``, then the block-file
    writes of ``prep.coded``. Block files are finished first: their coding runs while
    ``finish`` drives it, on the I/O pool next to the data files' writes, which are
    already queued.

    Raises:
        BaseException: the first failure (after every write was finished).
    """
    results, error = _finish(writes)
    if error is not None:
        raise error
    return _split(prep, results)


def _split(prep: PreparedSave, results: Sequence[Any]) -> tuple[list[list[list[int]]], list[CodedFile]]:
    n = len(prep.plans)
    return list(results[:n]), [f for r in results[n:] for f in r]


def _finish(writes: Sequence[Any]) -> tuple[list[Any], BaseException | None]:
    """Every write's result (block files first), and the first failure (None if none)."""
    order = sorted(range(len(writes)), key=lambda k: isinstance(writes[k], FileWrite))
    results: list[Any] = [None] * len(writes)
    error: BaseException | None = None
    for k in order:
        try:
            results[k] = writes[k].finish()
        except Exception as e:  # noqa: BLE001 - the others are still finished (a copy needs them)
            error = error or e
    return results, error
