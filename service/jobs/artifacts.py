"""A job's artifacts: files a job keeps beside its result (a run's measured timeline, its CUDA
allocator snapshot), stored in the job store and served by `GET /v1/jobs/{id}/artifacts/{name}`.

NOTE [ Job artifacts ]
1. A job function keeps a file with `ctx.keep_artifact(name, data, media_type)`, or says why one
   it would keep is absent with `ctx.artifact_absent(name, reason)` (a snapshot on a CPU run: not
   an error, a reason in the job's JSON). Both are fenced by the start's lease like every other
   write of a runner (NOTE [ Fencing a job's execution ] in store.py), and a new start of the job
   clears what an earlier start kept.
2. Names are plain file names (`NAME_PATTERN`: a letter or digit, then letters, digits, '.', '_',
   '-'; at most 64 characters, no '..'), checked when kept and when asked for, so no name can
   address anything but a row of this job (they are keys in SQLite, never paths; the check makes a
   traversal attempt a clear 422 rather than a 404).
3. Sizes are bounded: `MAX_ARTIFACT_BYTES` per file and `MAX_JOB_ARTIFACT_BYTES` per job. A file
   over either is not stored; it is listed as absent with its size and the limit, and the job
   still succeeds (the result is the job's answer; an artifact is evidence beside it). The limits
   are constants here, not settings: service/settings.py belongs to the service's configuration,
   and a site that needs larger snapshots changes these two numbers (64 MiB holds the snapshot of
   one step of GPT-2 small with every allocation's stack; SQLite's own limit is 1 GB a value).
4. The job's JSON lists every artifact (`Job.artifacts`: name, media type, bytes and the URL to
   fetch it, or the reason it is absent); the bytes are only served by the artifact route.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

__all__ = ["MAX_ARTIFACT_BYTES", "MAX_JOB_ARTIFACT_BYTES", "NAME_PATTERN", "MEDIA_TYPES", "ArtifactInfo",
           "check_name", "media_type_for", "TIMELINE", "SNAPSHOT"]

MAX_ARTIFACT_BYTES = 64 << 20  # one file (NOTE [ Job artifacts ] 3)
MAX_JOB_ARTIFACT_BYTES = 96 << 20  # all of one job's files
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)

# the names the built-in run job keeps
TIMELINE = "timeline.json"  # memplan-timeline/1 (memplan.executor.timeline.save_timeline's format)
SNAPSHOT = "snapshot.pickle"  # torch.cuda.memory._dump_snapshot's pickle, for pytorch.org/memory_viz

MEDIA_TYPES = {".json": "application/json", ".pickle": "application/octet-stream",
               ".png": "image/png", ".txt": "text/plain; charset=utf-8"}


class ArtifactInfo(BaseModel):
    """One file a job kept (`size_bytes`, `href`), or one it could not keep (`reason`)."""

    name: str = Field(description="the file's name, e.g. 'timeline.json'")
    media_type: str | None = Field(default=None, description="its Content-Type when served")
    size_bytes: int | None = Field(default=None, ge=0, description="bytes; null when absent")
    href: str | None = Field(default=None, description="where to GET it; null when absent")
    reason: str | None = Field(default=None, description="why it is absent; null when kept")


def check_name(name: object) -> str:
    """`name` when it is a plain artifact name (NOTE [ Job artifacts ] 2). Raises ValueError
    saying what a name may hold."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise ValueError(f"name: {name!r} is not an artifact name; names are 1-64 letters, digits, '.', '_' "
                         "or '-', starting with a letter or digit, without '..' (e.g. 'timeline.json')")
    return name


def media_type_for(name: str) -> str:
    """The Content-Type an artifact called `name` is served with (by its suffix; bytes otherwise)."""
    dot = name.rfind(".")
    return MEDIA_TYPES.get(name[dot:].lower() if dot >= 0 else "", "application/octet-stream")
