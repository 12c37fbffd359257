"""S3 multipart uploads: parts retried one by one, the upload completed or aborted.

``upload(fs, runner, path, size, parts, window)`` creates the upload, sends the parts
as the caller's iterator produces them with at most ``window`` in flight, the next as
soon as any part has been stored (``storage.batch``; each part a ``storage.runner`` call
with its own retries, hedging, stall detection and the deadline), completes it with the
parts in order, and returns. On any failure (a part out of attempts, the deadline, an
error of the iterator, an interrupt) the parts still in flight are cancelled and
awaited, and the upload is aborted, so no unfinished upload keeps holding storage; an abort that fails
as well is logged, and ``shardsafe gc`` finds the upload later
(``FsspecStorage.incomplete_uploads``). The object appears whole when the upload
completes, or not at all.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from .._numbers import ceil_div
from . import batch
from .runner import Request, Runner

log = logging.getLogger("shardsafe")


def upload(fs: Any, runner: Runner, path: str, size: int | None, part_size: int, parts: Iterable[bytes],
           window: int) -> None:
    """Uploads the ``size`` bytes of ``parts`` (each ``part_size`` bytes but the last) to
    ``path`` as one multipart upload of S3 filesystem ``fs`` (``size`` None: known once
    the parts end).

    Raises:
        StorageRequestError: a request failed on every attempt (the upload is aborted).
        CheckpointTimeoutError: the deadline passed (the upload is aborted).
    """
    bucket, key, _ = fs.split_path(path)
    count = "" if size is None else f"/{max(1, ceil_div(size, part_size))}"
    sent = 0
    created = runner.run(Request("POST", path, "create multipart upload"),
                         lambda: fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key))
    upload_id = created["UploadId"]
    etags: list[dict[str, Any]] = []

    def calls() -> Iterator[batch.Call[int, Any]]:
        nonlocal sent
        for number, body in enumerate(parts, 1):
            sent += len(body)
            yield (number, Request("PUT", path, f"part {number}{count}", size=len(body), idempotent=True),
                   functools.partial(fs._call_s3, "upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                                     PartNumber=number, Body=body))

    try:
        with contextlib.closing(batch.as_completed(runner, calls(), window)) as stored:
            for number, answer in stored:
                etags.append({"PartNumber": number, "ETag": answer["ETag"]})
        etags.sort(key=lambda part: part["PartNumber"])  # they arrive in any order; S3 wants them ascending
        runner.run(Request("POST", path, f"complete multipart upload of {len(etags)} parts"),
                   _completion(fs, path, bucket, key, upload_id, etags, sent))
    except BaseException:
        abort(fs, runner.for_cleanup(), path, upload_id)
        raise


def _completion(fs: Any, path: str, bucket: str, key: str, upload_id: str,
                etags: list[dict[str, Any]], size: int) -> Any:
    """The completing request. A retry after a lost answer finds the upload gone
    (``NoSuchUpload``): it did complete if the object has the expected size."""
    tries = [0]

    async def complete() -> Any:
        tries[0] += 1
        try:
            return await fs._call_s3("complete_multipart_upload", Bucket=bucket, Key=key,
                                     UploadId=upload_id, MultipartUpload={"Parts": etags})
        except FileNotFoundError:
            if tries[0] == 1:
                raise
            info = await fs._info(path, refresh=True)
            if int(info.get("size", -1)) != size:
                raise
            return None

    return complete


def abort(fs: Any, runner: Runner, path: str, upload_id: str) -> None:
    """Aborts the multipart upload ``upload_id`` of ``path``; a failure is logged (the
    upload is then left for ``shardsafe gc``), never raised over the error that matters."""
    bucket, key, _ = fs.split_path(path)
    try:
        runner.run(Request("DELETE", path, "abort multipart upload"),
                   lambda: fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id))
    except FileNotFoundError:
        pass  # already gone
    except OSError as e:  # a passed deadline and an exhausted budget are OSErrors too
        log.warning("could not abort the unfinished multipart upload %s of %s (%s: %s); "
                    "`shardsafe gc` removes it later", upload_id, path, type(e).__name__, e)


__all__ = ["abort", "upload"]
