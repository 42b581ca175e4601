"""Where the requests of live sequences wait: batch slots on instances, and a backlog.

Triton's sequence batcher, as a `RequestQueue`. Each instance ("lane") owns a fixed number of
slots (max_batch_size for the direct strategy, max_candidate_sequences for oldest). A sequence
takes a free slot with its START request and keeps it until its END request leaves the queue,
or until it has been idle longer than max_sequence_idle_microseconds; while no slot is free its
requests wait in a backlog, oldest sequence first. Requests of one sequence always run in order
on the instance that owns its slot.

`take_direct` forms Triton's direct batches (slot i of the batch is slot i of the instance,
empty slots padded with not-ready requests); `take_oldest` forms dynamic batches from the oldest
sequences that have no request in flight. Both return (slot, entry or None) pairs; the
scheduler adds control inputs and state. Pure bookkeeping on the event loop: no asyncio here.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from protocol.errors import InvalidArgument
from protocol.types import InferRequest
from scheduler.queue_scheduler import QUEUED, RUNNING, Entry, RequestQueue
from scheduler.sequence.config import FLAG_END, FLAG_START, CorrelationId, SequenceSettings

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Slot:
    """One batch slot of one instance, and the sequence that holds it (None: free)."""

    lane: int
    index: int
    owner: CorrelationId | None = None
    queue: deque = field(default_factory=deque)
    in_flight: bool = False  # oldest strategy: a request of this slot is running
    releasing: bool = False  # idle-released: freed once what it queued has left
    state: dict[str, np.ndarray] | None = None  # implicit state between requests


@dataclass(slots=True, eq=False)
class _Backlog:
    corrid: CorrelationId
    entries: deque = field(default_factory=deque)
    expires_ns: int | None = None  # the earliest request `timeout` of its requests

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        timeout_us = entry.request.timeout_us
        if timeout_us:
            expires = entry.admitted_ns + timeout_us * 1000
            if self.expires_ns is None or expires < self.expires_ns:
                self.expires_ns = expires


# A batch position: the slot, its request (None: a not-ready padding slot) and the sequence's
# implicit state as the request must see it (read before an END frees the slot).
Pair = tuple[Slot, Entry | None, dict | None]


class SequenceQueue(RequestQueue):
    """Slots, backlog and idle tracking of one model version's sequences."""

    def __init__(self, settings: SequenceSettings, lanes: list[bool]) -> None:
        """`lanes`: one flag per instance, True when it takes work (not passive)."""
        self._settings = settings
        self.lanes: list[list[Slot]] = [
            [Slot(lane, index) for index in range(settings.slots_per_instance)]
            for lane in range(len(lanes))
        ]
        # Lowest slot index first, across instances: new sequences spread over instances.
        self._free: list[tuple[int, int]] = [
            (slot.index, slot.lane)
            for lane, active in zip(self.lanes, lanes, strict=False)
            if active
            for slot in lane
        ]
        heapq.heapify(self._free)
        self._slot_of: dict[CorrelationId, Slot] = {}
        self._backlog_of: dict[CorrelationId, _Backlog] = {}
        self._backlogs: deque[_Backlog] = deque()
        self._last_seen: dict[CorrelationId, int] = {}
        self._next_reap: int | None = None
        self._count = 0
        self._now = 0  # the latest time a caller gave (push, reap, take)

    # -- admission --------------------------------------------------------------------------

    def check(self, request: InferRequest) -> None:
        """Refuse a request that continues a sequence nobody started (Triton's text)."""
        corrid = request.correlation_id
        if not request.sequence_flags & FLAG_START and not self.knows(corrid):
            raise InvalidArgument(
                f"inference request for sequence {corrid} to model '{self._settings.model}' "
                f"must specify the START flag on the first request of the sequence"
            )

    def push(self, entry: Entry) -> None:
        request = entry.request
        corrid = request.correlation_id
        flags = request.sequence_flags
        end = bool(flags & FLAG_END)
        self._now = entry.admitted_ns
        slot = self._slot_of.get(corrid)
        backlog = self._backlog_of.get(corrid)
        if flags & FLAG_START and (slot is not None or backlog is not None):
            logger.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence "
                "did not end before this sequence start. Previous sequence will be "
                "terminated early.",
                corrid,
                self._settings.model,
            )
        self._count += 1
        if end:
            self._last_seen.pop(corrid, None)
        else:
            self._last_seen[corrid] = entry.admitted_ns
            if self._next_reap is None:
                self._next_reap = entry.admitted_ns + self._settings.idle_ns
        if slot is None and backlog is None:
            if self._free:
                index, lane = heapq.heappop(self._free)
                slot = self.lanes[lane][index]
                slot.owner = corrid
                self._slot_of[corrid] = slot
            else:
                backlog = _Backlog(corrid)
                self._backlogs.append(backlog)
                if not end:
                    self._backlog_of[corrid] = backlog
                backlog.add(entry)
                return
        if slot is None:
            assert backlog is not None
            backlog.add(entry)
            if end:
                del self._backlog_of[corrid]
            return
        slot.queue.append(entry)
        if end:
            del self._slot_of[corrid]

    # -- idle sequences -----------------------------------------------------------------------

    def reap(self, now_ns: int) -> list[CorrelationId]:
        """Release the slots of sequences idle for max_sequence_idle_microseconds; their next
        request needs START again. Returns the released correlation IDs."""
        if self._next_reap is None or now_ns < self._next_reap:
            return []
        self._now = now_ns
        idle_ns = self._settings.idle_ns
        released: list[CorrelationId] = []
        idle_slots: list[Slot] = []
        for corrid, seen in list(self._last_seen.items()):
            if seen + idle_ns > now_ns:
                continue
            slot = self._slot_of.pop(corrid, None)
            if slot is not None:
                del self._last_seen[corrid]
                released.append(corrid)
                slot.releasing = True
                idle_slots.append(slot)
            elif corrid in self._backlog_of:  # waits for a slot: its idle time starts there
                self._last_seen[corrid] = now_ns
            else:
                del self._last_seen[corrid]
        for slot in idle_slots:  # after the scan: a backlogged sequence may take the slot
            self._release_if_drained(slot)
        self._next_reap = min(self._last_seen.values()) + idle_ns if self._last_seen else None
        return released

    def next_reap(self) -> int | None:
        """When idle sequences or backlog timeouts are next due (None: nothing to watch)."""
        due = self._next_reap
        for backlog in self._backlogs:
            if backlog.expires_ns is not None and (due is None or backlog.expires_ns < due):
                due = backlog.expires_ns
        return due

    def expire_backlogs(self, now_ns: int) -> list[Entry]:
        """Backlogged sequences whose request `timeout` ran out before they got a slot: they
        leave the queue, and their waiting requests are returned to be failed."""
        if not self._backlogs:
            return []
        expired: list[Entry] = []
        kept: deque[_Backlog] = deque()
        for backlog in self._backlogs:
            if backlog.expires_ns is None or backlog.expires_ns > now_ns:
                kept.append(backlog)
                continue
            if self._backlog_of.get(backlog.corrid) is backlog:
                del self._backlog_of[backlog.corrid]
                self._last_seen.pop(backlog.corrid, None)
            live = [entry for entry in backlog.entries if entry.live]
            self._count -= len(live)
            expired += live
        self._backlogs = kept
        return expired

    def knows(self, corrid: CorrelationId) -> bool:
        """A live sequence (holding a slot or waiting for one) has this correlation ID."""
        return corrid in self._slot_of or corrid in self._backlog_of

    def forget_sequences(self) -> None:
        """After a drain: no sequence is live here any more."""
        self._slot_of.clear()
        self._backlog_of.clear()
        self._last_seen.clear()
        self._next_reap = None

    def active_sequences(self) -> int:
        """Sequences started and neither ended nor released (with a slot or waiting for one)."""
        return len(self._slot_of) + len(self._backlog_of)

    # -- forming batches ----------------------------------------------------------------------

    def take_direct(self, lane: int, now_ns: int, flush: bool) -> tuple[list[Pair], int | None]:
        """Triton's direct batch for one instance: slots 0..highest busy slot, one request
        each, empty (or shape-incompatible) slots as None; or ([], when to look again)."""
        settings = self._settings
        self._now = now_ns
        slots = self.lanes[lane]
        highest = -1
        ready = 0
        earliest: int | None = None
        shape: tuple | None = None
        for slot in slots:
            head = self._head(slot)
            if head is not None:
                highest = slot.index
                ready += 1
                if earliest is None or head.admitted_ns < earliest:
                    earliest = head.admitted_ns
        if highest < 0:
            return [], None
        if settings.delay_ns and settings.minimum_slot_utilization and not flush:
            assert earliest is not None
            if (
                now_ns - earliest <= settings.delay_ns
                and ready / settings.max_batch < settings.minimum_slot_utilization
            ):
                return [], earliest + settings.delay_ns + 1
        pairs: list[Pair] = []
        for slot in slots[: highest + 1]:
            head = slot.queue[0] if slot.queue else None
            if head is not None and settings.batching:
                key = _shape_key(head.request)
                if shape is None:
                    shape = key
                elif key != shape:
                    head = None  # waits for a batch of its own shape, as Triton's null slot
            pairs.append(self._pop(slot) if head is not None else (slot, None, None))
        return pairs, None

    def has_work(self, lane: int) -> bool:
        """Whether one instance's slots hold a request it could run next (the rate limiter's
        turn is asked only for such an instance)."""
        oldest = self._settings.oldest
        return any(
            not (oldest and slot.in_flight) and self._head(slot) is not None
            for slot in self.lanes[lane]
        )

    def take_oldest(self, lane: int, now_ns: int, flush: bool) -> tuple[list[Pair], int | None]:
        """A dynamic batch from the sequences of one instance with nothing in flight, oldest
        head first, by preferred_batch_size and max_queue_delay_microseconds."""
        settings = self._settings
        self._now = now_ns
        heads = []
        for slot in self.lanes[lane]:
            if slot.in_flight:
                continue
            head = self._head(slot)
            if head is not None:
                heads.append((head.admitted_ns, slot.index, slot))
        if not heads:
            return [], None
        heads.sort()
        if settings.batching:
            shape = _shape_key(heads[0][2].queue[0].request)
            heads = [item for item in heads if _shape_key(item[2].queue[0].request) == shape]
        count = min(len(heads), settings.max_batch)
        oldest = heads[0][0]
        due = (
            settings.delay_ns == 0
            or flush
            or now_ns - oldest >= settings.delay_ns
            or count >= max(settings.preferred)
        )
        if not due:
            fitting = [size for size in settings.preferred if size <= count]
            if not fitting:
                return [], oldest + settings.delay_ns
            count = max(fitting)
        pairs: list[Pair] = []
        for _, _, slot in heads[:count]:
            slot.in_flight = True
            pairs.append(self._pop(slot))
        return pairs, None

    def finished(self, slots: list[Slot]) -> None:
        """The oldest strategy's requests of these slots have come back."""
        for slot in slots:
            slot.in_flight = False

    def _head(self, slot: Slot) -> Entry | None:
        """The slot's next live request, dropping cancelled ones (an END among them still
        ends the sequence)."""
        queue = slot.queue
        while queue and not queue[0].live:
            gone = queue.popleft()
            if gone.request.sequence_flags & FLAG_END:
                self._release(slot)
        if slot.releasing:
            self._release_if_drained(slot)
        return queue[0] if queue else None

    def _pop(self, slot: Slot) -> Pair:
        entry = slot.queue.popleft()
        entry.state = RUNNING
        self._count -= 1
        flags = entry.request.sequence_flags
        state = None if flags & FLAG_START else slot.state
        if flags & FLAG_END:
            self._release(slot)
        elif slot.releasing:
            self._release_if_drained(slot)
        return slot, entry, state

    # -- freeing slots ------------------------------------------------------------------------

    def _release_if_drained(self, slot: Slot) -> None:
        if not any(entry.live for entry in slot.queue):
            slot.queue.clear()
            self._release(slot)

    def _release(self, slot: Slot) -> None:
        """The slot's sequence is over: give the slot to the oldest backlogged sequence, or
        mark it free. Anything still queued behind an END belongs to nobody and is dropped
        from the count by its own cancellation."""
        if slot.owner is not None and self._slot_of.get(slot.owner) is slot:
            del self._slot_of[slot.owner]
        slot.owner = None
        slot.releasing = False
        slot.state = None
        while self._backlogs:
            backlog = self._backlogs.popleft()
            if not any(entry.live for entry in backlog.entries):
                if self._backlog_of.get(backlog.corrid) is backlog:
                    del self._backlog_of[backlog.corrid]
                continue
            slot.owner = backlog.corrid
            slot.queue.extend(backlog.entries)
            if self._backlog_of.get(backlog.corrid) is backlog:
                del self._backlog_of[backlog.corrid]
                self._slot_of[backlog.corrid] = slot
                # Idle time counts from when the sequence could run, not from its wait.
                if backlog.corrid in self._last_seen:
                    self._last_seen[backlog.corrid] = max(
                        self._last_seen[backlog.corrid], self._now
                    )
            return
        heapq.heappush(self._free, (slot.index, slot.lane))

    # -- leaving --------------------------------------------------------------------------------

    def discard(self, entry: Entry) -> None:
        self._count -= 1

    def clear(self) -> list[Entry]:
        left = [entry for entry in self._all_entries() if entry.state == QUEUED]
        for lane in self.lanes:
            for slot in lane:
                slot.queue.clear()
        self._backlogs.clear()
        self._backlog_of.clear()
        self._count = 0
        return left

    def _all_entries(self) -> Iterator[Entry]:
        for lane in self.lanes:
            for slot in lane:
                yield from slot.queue
        for backlog in self._backlogs:
            yield from backlog.entries

    def __len__(self) -> int:
        return self._count


def _shape_key(request: InferRequest) -> tuple:
    return tuple((tensor.name, tensor.shape) for tensor in request.inputs)
