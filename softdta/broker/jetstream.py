"""A JetStream publisher over nats-py: connect, make sure the stream exists, publish with a de-duplication ID
and wait for the stream's acknowledgement. Every failure is a `BrokerUnavailable` whose message says what
happened; the caller decides when to try again (nats-py's own reconnecting is off, so nothing is buffered
where the caller cannot count it)."""

from __future__ import annotations

import asyncio

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from softdta.core.export import checked_url
from softdta.errors import SoftdtaError

STREAM_NOT_FOUND = 10059  # JetStream's API error code
STREAM_NAME_IN_USE = 10058


class BrokerUnavailable(SoftdtaError, ConnectionError):
    """The broker cannot take messages now; the message says why."""


class StreamMissing(BrokerUnavailable):
    """No stream takes the subject: the stream was deleted (or never made)."""


class JetStream:
    """One connection to a NATS server, publishing into stream `stream`, which takes `subjects`."""

    def __init__(self, url: str, stream: str, subjects: list[str], duplicate_window_s: float, timeout: float = 2.0):
        self.url = checked_url(url)
        self.stream, self.subjects = stream, subjects
        self.duplicate_window_s, self.timeout = duplicate_window_s, timeout
        self.client: Client | None = None
        self.context: JetStreamContext | None = None

    async def connect(self) -> bool:
        """Connect and make sure the stream exists; True if it had to be created."""
        await self.close()
        try:
            # nats-py tries a refused server again and again at connect: the deadline is ours
            self.client = await asyncio.wait_for(
                nats.connect(self.url, connect_timeout=self.timeout, allow_reconnect=False, max_reconnect_attempts=0,
                             error_cb=_quiet), self.timeout)
        except (OSError, nats.errors.Error, TimeoutError) as error:
            raise BrokerUnavailable(f"cannot reach the NATS server at {self.url} ({_reason(error)})") from None
        self.context = self.client.jetstream(timeout=self.timeout)
        return await self.ensure_stream()

    async def ensure_stream(self) -> bool:
        """Create the stream if it is missing; True if it was. A stream of the same name that does not take our
        subjects is an error the operator must settle."""
        context = self._context()
        try:
            info = await context.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            info = None
        except (OSError, nats.errors.Error, TimeoutError) as error:
            raise BrokerUnavailable(f"NATS server {self.url}: JetStream does not answer ({_reason(error)}); is it "
                                    "running with JetStream (nats-server --jetstream)?") from None
        if info is not None:
            missing = set(self.subjects) - set(info.config.subjects or [])
            if missing:
                raise BrokerUnavailable(f"stream {self.stream} at {self.url} does not take the subjects "
                                        f"{sorted(missing)}; add them to it, or set another [export] stream")
            return False
        try:
            await context.add_stream(name=self.stream, subjects=self.subjects,
                                     duplicate_window=self.duplicate_window_s)
        except (OSError, nats.errors.Error, TimeoutError) as error:
            raise BrokerUnavailable(f"cannot create stream {self.stream} at {self.url} ({_reason(error)})") from None
        return True

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> bool:
        """Publish one message and wait for the stream's acknowledgement; True if the stream already had its
        de-duplication ID (a message sent again)."""
        context = self._context()
        try:
            ack = await context.publish(subject, payload, timeout=self.timeout, headers=headers)
        except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
            raise StreamMissing(f"no stream at {self.url} takes {subject} (stream {self.stream} was deleted?)"
                                ) from None
        except nats.js.errors.APIError as error:
            if error.err_code == STREAM_NOT_FOUND:
                raise StreamMissing(f"stream {self.stream} is gone from {self.url}") from None
            raise BrokerUnavailable(f"NATS server {self.url} refused a message on {subject} ({_reason(error)})"
                                    ) from None
        except (OSError, nats.errors.Error, TimeoutError) as error:
            raise BrokerUnavailable(f"lost the NATS server at {self.url} ({_reason(error)})") from None
        return bool(ack.duplicate)

    @property
    def connected(self) -> bool:
        return self.client is not None and self.client.is_connected

    def _context(self) -> JetStreamContext:
        if self.context is None or self.client is None or not self.client.is_connected:
            raise BrokerUnavailable(f"not connected to the NATS server at {self.url}")
        return self.context

    async def close(self) -> None:
        client, self.client, self.context = self.client, None, None
        if client is not None and not client.is_closed:
            try:
                await client.close()
            except (OSError, nats.errors.Error, TimeoutError):
                pass  # a connection already broken has nothing left to close


async def _quiet(error: Exception) -> None:
    """nats-py reports connection errors here as well as raising them; the raise is what counts."""


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
