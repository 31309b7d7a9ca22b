"""What the log streamer and the capture outbox share: the chunk limit, reading a chunk, a deadline."""

from __future__ import annotations

import time

CHUNK_BYTES = 1 << 20  # the collector's body limit


class Deadline:
    """A point in monotonic time after which no new request starts (None: no limit)."""

    def __init__(self, seconds: float | None = None) -> None:
        self.at: float | None = None
        self.reset(seconds)

    def reset(self, seconds: float | None) -> None:
        """Move the deadline to ``seconds`` from now (None: no limit)."""
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds left (None: unlimited); 0 once passed."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """True once the deadline is reached."""
        return self.at is not None and time.monotonic() >= self.at


def read_chunk(path: str, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset`` (fewer at the end of the file)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(limit)
