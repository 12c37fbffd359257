"""The machine's own limit of an S3 transfer: a plain boto3 upload and download of the same bytes.

``bench.pipeline`` compares a save to a store with the time of the same number of bytes
going up through the same proxy to the same server, moved by code that is not
shardsafe's: boto3's managed transfer (``upload_fileobj`` / ``download_fileobj`` of one
object, ``PART_SIZE`` parts, ``THREADS`` at once, like ``storage.fsspec``'s defaults). What
that takes on this machine (the S3 server's own CPU, the proxy, the client's checksums)
is the floor a save of those stored bytes can reach here.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from typing import Any

PART_SIZE = 32 << 20
THREADS = 8


@dataclass
class PlainS3:
    """A boto3 client on a bucket, and the transfer settings of the plain upload."""

    client: Any
    bucket: str
    config: Any

    @classmethod
    def for_options(cls, bucket: str, storage_options: dict[str, Any],
                    part_size: int = PART_SIZE, threads: int = THREADS) -> PlainS3:
        """A client for the endpoint and keys of s3fs ``storage_options`` (``endpoint_url``,
        ``key``, ``secret``, ``client_kwargs.region_name``)."""
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        client = boto3.client(
            "s3", endpoint_url=storage_options["endpoint_url"],
            aws_access_key_id=storage_options.get("key"),
            aws_secret_access_key=storage_options.get("secret"),
            region_name=(storage_options.get("client_kwargs") or {}).get("region_name"),
            config=Config(max_pool_connections=threads + 2))
        config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                max_concurrency=threads, use_threads=True)
        return cls(client, bucket, config)

    def upload(self, key: str, payload: bytes) -> float:
        """Seconds to upload ``payload`` as object ``key`` (a multipart upload when it
        is at least one part)."""
        t0 = time.perf_counter()
        self.client.upload_fileobj(io.BytesIO(payload), self.bucket, key, Config=self.config)
        return time.perf_counter() - t0

    def download(self, key: str, size: int) -> float:
        """Seconds to download object ``key`` (checked to be ``size`` bytes) into memory.

        Raises:
            AssertionError: the object read back is not ``size`` bytes.
        """
        out = io.BytesIO()
        t0 = time.perf_counter()
        self.client.download_fileobj(self.bucket, key, out, Config=self.config)
        took = time.perf_counter() - t0
        if out.getbuffer().nbytes != size:
            raise AssertionError(f"plain download of {key}: {out.getbuffer().nbytes} bytes, {size} expected")
        return took

    def remove(self, key: str) -> None:
        """Deletes object ``key``."""
        self.client.delete_object(Bucket=self.bucket, Key=key)


def payload(size: int) -> bytes:
    """``size`` random bytes (incompressible, like a compressed checkpoint's)."""
    return os.urandom(size)


__all__ = ["PART_SIZE", "THREADS", "PlainS3", "payload"]
