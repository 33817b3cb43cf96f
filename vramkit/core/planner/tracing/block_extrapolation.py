"""The trace of a model of N identical blocks, rebuilt exactly from traces of k, k+1 and k+2.

A step's ops are mostly its N decoder blocks', so tracing the model cut to a few blocks
(`repeated_blocks.cut_to`) is N/(3k+3)-fold cheaper. Fitting the final figures along a line is
wrong (a study of the Phi-1.5 plan: reserves off by 4-134 MiB, peaks moving from one moment of
the step to another as N grows), so what is carried to N blocks is the recorder's log itself
(`StorageRecorder.log`: every allocation, free, host move and peak reset, in order), and the
N-block log is replayed through the recorder's own accounting: peaks per phase, what is live at
them (the holder rows), and the allocation events the caching-allocator model replays.

Each log entry becomes a token that does not name its storage: an allocation is its size,
category, whether autograd saved it, where it was made (repeated blocks folded to `*`), shape,
dtype and phase label; a free (or host move) is the token of the allocation it gives back and
that allocation's rank among the live ones of the same token, counted from the newer end or
(negative) from the older, whichever is nearer. The tokens of k, k+1 and k+2 blocks are aligned
as "the k-block log with chunks inserted once, and twice" (`insertions`); the N-block log is then
the k-block one with each chunk inserted N-k times (`expand`). Replaying it resolves each free to
the storage of its rank, as the traced logs did.

Never under: anything that breaks this (a log that is not the k-block one with chunks inserted,
chunks that do not repeat at k+2, cuDNN workspaces, a kept timeline) returns None and the caller
traces the whole model.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from vramkit.core.planner.tracing.fake_trace import StepTrace, step_result
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    ALLOC,
    LEAVE,
    RESET,
    StorageRecorder,
)

SHORT_COUNTS = (2, 3, 4)
"""k, k+1, k+2 blocks: from k = 2 on, every block has one before and one after it, as in the
whole model."""


@dataclass
class Tokens:
    """Interned log tokens shared by the traces being compared (equal tokens, equal ints)."""

    table: list[tuple] = dataclasses.field(default_factory=list)
    _ids: dict[tuple, int] = dataclasses.field(default_factory=dict)

    def of(self, token: tuple) -> int:
        """The int of `token`, new or known."""
        found = self._ids.get(token)
        if found is None:
            found = self._ids[token] = len(self.table)
            self.table.append(token)
        return found


def log_tokens(recorder: StorageRecorder, tokens: Tokens) -> list[int] | None:
    """`recorder.log` as interned tokens (see the module docstring), or None when the log does
    not tell the whole step (cuDNN workspaces, a kept timeline)."""
    if recorder._workspaces or recorder.keep_timeline:
        return None
    categories, saved, origins = recorder._category, recorder._saved, recorder._origin
    token_of: dict[int, int] = {}
    live: dict[int, list[int]] = {}  # allocation token → its live serials, oldest first
    out = []
    for entry in recorder.log:
        kind = entry[0]
        if kind == ALLOC:
            _, serial, size, label = entry
            category = categories.get(serial) or ACTIVATIONS
            token = tokens.of((ALLOC, size, category, serial in saved, origins[serial], label))
            token_of[serial] = token
            live.setdefault(token, []).append(serial)
        elif kind == RESET:
            token = tokens.of(entry)
        else:
            allocated = token_of[entry[1]]
            serials = live[allocated]
            index = serials.index(entry[1])
            newer = len(serials) - 1 - index
            del serials[index]
            # Counted from the nearer end: a list given back oldest first (the optimizer's
            # step counters moved to the host in parameter order) has the same tokens
            # whatever its length, as one given back newest first (autograd's saved tensors).
            token = tokens.of((kind, allocated, newer if newer <= index else -1 - index))
        out.append(token)
    return out


def insertions(
    short: Sequence[int], longer: Sequence[int], longest: Sequence[int]
) -> list[tuple[int, list[int]]] | None:
    """The chunks that make `longer` out of `short` when inserted once and `longest` when
    inserted twice, each at its place: (position in `short`, chunk) in order; None when there
    are none.

    Walks the three logs while they agree; where they part, a chunk of `longer` is skipped (the
    shortest first) that `longest` holds twice at that point and after which `short`'s next
    token comes; a choice that leads nowhere is undone (depth first, each dead end
    remembered). Chunks can lie a token apart (a `foreach` op's outputs, one list per op), and
    `longer` alone can be split in ways that repeat wrongly (a list of allocations and the list
    of their frees taken as one chunk): `longest` tells them apart. Walking on while all three
    agree loses nothing: a chunk that begins with the token after it is the same chunk rotated,
    which inserted any number of times gives the same log.
    """
    n, m = len(short), len(longer)
    spare = m - n
    if spare <= 0 or len(longest) != m + spare:
        return None
    where: dict[int, list[int]] = {}
    for position, token in enumerate(longer):
        where.setdefault(token, []).append(position)

    def agree(i: int, j: int) -> tuple[int, int]:
        # `longest` is at 2j - i: every token `longer` inserted so far is there twice.
        while i < n and j < m and short[i] == longer[j] == longest[2 * j - i]:
            i += 1
            j += 1
        return i, j

    def twice(i: int, j: int, end: int) -> bool:
        chunk = longer[j:end]
        at = 2 * j - i
        size = end - j
        return longest[at : at + size] == chunk and longest[at + size : at + 2 * size] == chunk

    dead: set[tuple[int, int]] = set()
    # Each frame: a state where the logs part, and the chunk ends still to try there.
    frames: list[tuple[int, int, list[int]]] = []
    i, j = agree(0, 0)
    while True:
        if i == n and twice(i, j, m):
            chunks = [(at, list(longer[start:end])) for at, start, (end, *_) in frames]
            if j < m:
                chunks.append((n, list(longer[j:])))
            return chunks
        left = spare - (j - i)
        if i < n and (i, j) not in dead and left > 0:
            positions = where.get(short[i], [])
            first = bisect.bisect_right(positions, j)
            last = bisect.bisect_right(positions, j + left)
            ends = [end for end in positions[first:last] if twice(i, j, end)]
            if ends:
                frames.append((i, j, ends))
                i, j = agree(i, ends[0])
                continue
        dead.add((i, j))
        # Back to the latest frame with an end left to try.
        while frames:
            at, start, ends = frames.pop()
            if len(ends) > 1:
                frames.append((at, start, ends[1:]))
                i, j = agree(at, ends[1])
                break
            dead.add((at, start))
        else:
            return None


def expand(short: Sequence[int], chunks: Sequence[tuple[int, list[int]]], copies: int) -> list[int]:
    """`short` with each chunk inserted `copies` times at its place."""
    out: list[int] = []
    done = 0
    for position, chunk in chunks:
        out.extend(short[done:position])
        out.extend(chunk * copies)
        done = position
    out.extend(short[done:])
    return out


def replay(log: Sequence[int], tokens: Tokens) -> StorageRecorder:
    """A recorder that has seen the step `log` (tokens) describes: its peaks, what was live at
    them, their labels and the allocation events, by the recorder's own accounting."""
    recorder = StorageRecorder()  # never entered: the sizes come rounded in the tokens
    table = tokens.table
    live: dict[int, list[int]] = {}
    left: set[int] = set()
    for token in log:
        entry = table[token]
        kind = entry[0]
        if kind == ALLOC:
            _, size, category, saved, origin, label = entry
            recorder._label = label
            serial = recorder._add(size, origin)
            recorder._category[serial] = category
            if saved:
                recorder._saved.add(serial)
            live.setdefault(token, []).append(serial)
        elif kind == RESET:
            recorder._label = entry[1]
            recorder.reset_peak()
        else:
            _, allocated, rank = entry
            serials = live[allocated]
            serial = serials.pop(len(serials) - 1 - rank if rank >= 0 else -1 - rank)
            if kind == LEAVE:
                if recorder._leave(serial):
                    left.add(serial)
            else:
                recorder._remove(serial)
    if left:
        recorder.events = [event for event in recorder.events if event[0] not in left]
    return recorder


def rebuilt_trace(
    recorders: Sequence[StorageRecorder], traces: Sequence[StepTrace], blocks: int
) -> StepTrace | None:
    """The `StepTrace` of `blocks` blocks from the recorders and traces of `SHORT_COUNTS`
    blocks, or None when their logs do not repeat exactly (see the module docstring)."""
    tokens = Tokens()
    logs = [log_tokens(recorder, tokens) for recorder in recorders]
    if any(log is None for log in logs):
        return None
    first, second, third = logs
    chunks = insertions(first, second, third)
    if chunks is None:
        return None
    if len({frozenset(trace.attention_kernels) for trace in traces}) != 1:
        return None
    recorder = replay(expand(first, chunks, blocks - SHORT_COUNTS[0]), tokens)
    kernels = traces[-1].attention_kernels
    return dataclasses.replace(step_result(recorder), attention_kernels=kernels)


def carried_total(values: Sequence[int], blocks: int) -> int | None:
    """A per-parameter sum (bytes) at `SHORT_COUNTS` blocks carried to `blocks`, or None when
    it does not grow by the same amount per block."""
    first, second, third = values
    if third - second != second - first:
        return None
    return third + (blocks - SHORT_COUNTS[-1]) * (third - second)
