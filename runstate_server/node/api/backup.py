"""GET /v1/cluster/backup: a consistent copy of this node's whole state at its applied index, as a
backup file (node/backup.py, backup_file.py), streamed; an operator admin key. `runstate backup`
asks a follower for it when the cluster has one, so the leader's work is not disturbed."""

from __future__ import annotations

import contextlib
import os

from aiohttp import web

from runstate_server.node.api.access import require_operator
from runstate_server.node.api.routes import ADMIN, RouteTable, caller_of, node_of
from runstate_server.node.api.schemas import STRING
from runstate_server.node.backup import BackupBusy
from runstate_server.node.backup_file import BackupFileError
from runstate_server.node.errors import ApiError

routes = RouteTable()

STREAM_CHUNK_BYTES = 1024 * 1024  # read from the temporary file and written to the client at once
BACKUP_MEDIA_TYPE = "application/vnd.runstate.backup"
INDEX_HEADER = "X-Runstate-Backup-Index"  # the applied index the backup is at


@routes(
    "GET", "/v1/cluster/backup",
    "A backup of this node's whole state at its applied index (an operator admin key): the file `runstate backup` "
    "writes, streamed. The node keeps serving meanwhile; one backup at a time per node",
    errors=("FORBIDDEN", "CONFLICT", "UNAVAILABLE"), permission=ADMIN, answer=STRING, media_type=BACKUP_MEDIA_TYPE,
)
async def backup(request: web.Request) -> web.StreamResponse:
    require_operator(caller_of(request), "a backup")
    node = node_of(request)
    path = node.backups.temporary_path()
    try:
        try:
            header = await node.backups.take(path, fsync=False)
        except BackupBusy as error:
            raise ApiError("CONFLICT", str(error)) from None
        except (OSError, BackupFileError) as error:
            raise ApiError("UNAVAILABLE", f"the backup failed on {node.config.node_id}: {error}") from None
        response = web.StreamResponse(headers={
            "Content-Type": BACKUP_MEDIA_TYPE, "Content-Length": str(os.path.getsize(path)),
            INDEX_HEADER: str(header.index),
        })
        await response.prepare(request)
        with open(path, "rb") as file:
            while chunk := file.read(STREAM_CHUNK_BYTES):
                await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
