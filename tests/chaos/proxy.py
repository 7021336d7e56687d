"""A TCP link that can be frozen (silence) or cut (reset, and refused until restored).

Built on the coordination tests' `FreezableProxy` (frozen: bytes are held, connections stay
open, as a dead link looks). Cut adds the other partition a serve process can see: every
connection is closed at once and new ones are closed as soon as they are accepted, so the client
gets errors instead of silence.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.coordination.proxy import FreezableProxy


class Link(FreezableProxy):
    """One serve process's private path to a server (its ZooKeeper or its Redis)."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.cut_off = False

    def cut(self) -> None:
        """Close every connection now and refuse new ones until `restore()`."""
        self.cut_off = True
        for writer in self._writers:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()
        self._writers.clear()

    def restore(self) -> None:
        """End a freeze or a cut."""
        self.cut_off = False
        self.thaw()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        self._writers = [w for w in self._writers if not w.is_closing()]  # bounded over a soak
        await super()._handle(reader, writer)
