"""Offload in the executor: a plan's transfer ops (`offload i`, `fetch i`, `offload_record i`,
`fetch_record i`, docs/chain-model.md section 10.9) run by copies to pinned host memory on a side
stream, overlapped with the window op.

NOTE [ Offload in the executor ]
1. One `Offloader` per runner (or installed plan); `begin_step` starts each step afresh. It holds
   device storages as `_Entry`s: one per storage, so a tensor saved by a record that is the stage
   input a_{i-1} or its output a_i (the same storage) has one copy, moved with that activation.
2. A stage that is recorded while any of record i, a_{i-1} or a_i is ever moved runs under
   `torch.autograd.graph.saved_tensors_hooks` (`recording`): pack returns a handle (`_Saved`:
   the entry and the view's dtype, offset, size and stride), unpack returns a tensor on the
   entry's current device storage. Parameters, buffers, the loop's a_0, and tensors on another
   device are saved as they are. The record's input is `cut` from a_{i-1} by `_Cut` (an alias
   whose backward hands d_{i-1} to a slot): a leaf input (the runner's plain record) would be held
   by autograd's gradient accumulator and pin a_{i-1} on the device after it was offloaded.
3. `issue(op)` checks a transfer and queues it; `start_window()`, called as the window op (the
   next compute op; drops in between run first) starts, starts the queued copies: the side stream
   waits for the main stream (`wait_stream`), copies with non_blocking=True (offload: to a pinned host buffer; fetch: into a new device
   buffer allocated on the main stream) and records an event. `end_window()`, called after the
   window op (the next compute op), makes the main stream wait on the events; an offloaded
   entry's device storage is then released and a fetched one's is set. No `record_stream`: a
   storage is released only after the main stream waits on its copy, and its block is in the
   main stream's pool (a fetch's buffer is allocated on the main stream too), so any reuse is
   ordered after the copy; `record_stream` would also keep the block counted in
   `max_memory_allocated` until the allocator polls the event, above the replay's bytes.
   Device bytes therefore follow the replay: an offloaded tensor is freed when its window ends,
   a fetched one is allocated when its window starts.
4. Reading a tensor on the host (a_i in `F/R i+1`, `loss`, or record i and a pinned a_{i-1} in
   `B i`) is refused with an `ExecutorError` naming it and the fetch that is missing. A tensor
   read while its fetch is pending is waited for first (never wrong data).
5. A record's entry saved by another record too (a module's cached tensor that is not a
   parameter or buffer) is not moved by `offload_record` (it would not free device memory).
6. On the CPU there is no device memory to save: `check_device` refuses a plan with transfer ops
   before anything runs (`CPU_REFUSAL`). Tests run the same code with `host_device="cpu"`
   (copies to other CPU tensors, streams and events are no-ops), a private keyword of the runner.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from memplan.executor.report import ExecutorError
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["TRANSFER_OPS", "CPU_REFUSAL", "RUN_CPU_REFUSAL", "has_transfers", "check_device", "Offloader", "OnHost", "Slots"]

log = logging.getLogger(__name__)

TRANSFER_OPS = ("offload", "fetch", "offload_record", "fetch_record")
COMPUTE_OPS = ("F", "R", "loss", "B")

CPU_REFUSAL = (
    "offload: this plan moves activations to host memory, which needs a CUDA device (there is no "
    "device memory to save on the CPU); plan without offload_bandwidth"
)
# the same line where a run (`memplan run`, POST /v1/runs) took the option
RUN_CPU_REFUSAL = "--offload-bandwidth: " + CPU_REFUSAL.removeprefix("offload: ")


def has_transfers(ops: Sequence[Any]) -> bool:
    """True when the op list has a transfer op (offload, fetch, offload_record, fetch_record)."""
    return any(op[0] in TRANSFER_OPS for op in ops)


def check_device(ops: Sequence[Any], device: torch.device, host_device: str | None = None) -> None:
    """Raise `ExecutorError(CPU_REFUSAL)` when `ops` move tensors and `device` is not CUDA (or
    CUDA is not available); `host_device` (tests only) lets the CPU run them."""
    if not has_transfers(ops) or host_device is not None:
        return
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise ExecutorError(CPU_REFUSAL)


def _what(kind: str, i: int) -> tuple[str, str]:
    """(name, fetch op) of a_i or record i, as messages say them."""
    if kind == "act":
        return f"a_{i}", f"fetch {i}"
    return f"the record of stage {i}", f"fetch_record {i}"


class OnHost:
    """What stands in for a_i in the runner while a_i is on the host (reading it is refused)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __repr__(self) -> str:
        return f"OnHost(a_{self.i})"


class Slots(list):
    """A record's input as the runner keeps it under offload: one slot per leaf of a_{i-1}, where
    `_Cut`'s backward puts d_{i-1} (NOTE point 2)."""

    def gradients(self) -> list:
        """The gradients stored, aligned with the input's leaves (None: none flowed)."""
        return [s[0] for s in self]


class _Entry:
    """One device storage that may move to the host and back (NOTE point 1)."""

    __slots__ = ("storage", "nbytes", "host", "event", "state", "kind", "i", "readers", "__weakref__")

    def __init__(self, storage: torch.UntypedStorage, kind: str, i: int) -> None:
        self.storage: torch.UntypedStorage | None = storage
        self.nbytes = storage.nbytes()
        self.host: torch.Tensor | None = None
        self.event: Any = None  # the pending copy's event (CUDA), None when none
        self.state = "device"  # device | to_host | host | to_device
        self.kind, self.i = kind, i  # owner: ("act", i) or ("record", i)
        self.readers: set[int] = set()  # records that saved it

    def where(self) -> str:
        return _what(self.kind, self.i)[0]


class _Saved:
    """A saved tensor as a record holds it: its entry and the view (NOTE point 2)."""

    __slots__ = ("entry", "dtype", "offset", "size", "stride", "__weakref__")

    def __init__(self, entry: _Entry, t: torch.Tensor) -> None:
        self.entry = entry
        self.dtype, self.offset = t.dtype, t.storage_offset()
        self.size, self.stride = tuple(t.size()), tuple(t.stride())


class _Cut(torch.autograd.Function):
    """a_{i-1} as a record's input: an alias whose backward stores d_{i-1} in `slot` (NOTE point 2)."""

    @staticmethod
    def forward(ctx, slot, dummy, x):
        ctx.slot = slot
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot[0] = grad
        return None, None, None


class Offloader:
    """The transfer ops of one schedule on `device` (NOTE [ Offload in the executor ])."""

    def __init__(self, ops: Sequence[Any], stages: Sequence[torch.nn.Module], *,
                 device: torch.device, host_device: str | None = None) -> None:
        """`ops`: the schedule (tuples); `stages`: whose parameters and buffers are never moved;
        `host_device`: None (CUDA: pinned host memory, a side stream) or "cpu" (tests: plain CPU
        copies, no streams)."""
        ops = [tuple(op) for op in ops]
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = host_device is None
        self.stages = list(stages)
        self.acts = {op[1] for op in ops if op[0] in ("offload", "fetch")}
        self.records = {op[1] for op in ops if op[0] in ("offload_record", "fetch_record")}
        # stages recorded under the hooks: their record, input or output may move (NOTE point 2)
        self.hooked = self.records | {i + 1 for i in self.acts} | set(self.acts)
        self._side = torch.cuda.Stream(self.device) if self.cuda else None
        self._dummy = torch.empty(0, device=self.device, requires_grad=True)
        self.begin_step()

    # -- state of one step ----------------------------------------------------------------------

    def begin_step(self) -> None:
        """Forget the last step's entries (call at the start of every step)."""
        self._live: weakref.WeakValueDictionary[int, _Entry] = weakref.WeakValueDictionary()
        self._moving: dict[int, _Entry] = {}  # offloads in this window, by their device pointer
        self._act: dict[int, tuple[Any, list]] = {}  # i -> (spec, leaves: tensor or (entry, view))
        self._rec: dict[int, list[_Entry]] = {}  # record i -> its own entries (weakly by handles)
        self._rec_refs: dict[int, list[weakref.ref]] = {}
        self._queued: list[tuple[str, int, list[_Entry]]] = []  # issued, window not started
        self._pending: list[tuple[str, int, list[_Entry]]] = []  # copying during the window op
        self._fixed = {t.untyped_storage().data_ptr() for s in self.stages
                       for t in (*s.parameters(), *s.buffers())}
        self.moved_bytes = 0  # device -> host, this step

    # -- records --------------------------------------------------------------------------------

    def cut(self, value: Any) -> tuple[Any, Slots]:
        """(record input aliasing `value`, slots): each floating tensor of `value` passes through
        `_Cut`; after `B i`, `slots.gradients()` are d_{i-1} (NOTE point 2)."""
        flat, spec = tree_flatten(value)
        out, slots = [], Slots()
        for t in flat:
            slot: list = [None]
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                t = _Cut.apply(slot, self._dummy, t.detach())
            elif isinstance(t, torch.Tensor):
                t = t.detach()
            out.append(t)
            slots.append(slot)
        return tree_unflatten(out, spec), slots

    @contextlib.contextmanager
    def recording(self, i: int, inputs: Any) -> Iterator[None]:
        """Saved-tensor hooks around stage i's recorded forward (NOTE point 2). `inputs`: a_{i-1}
        as the stage receives it (its storages are a_{i-1}'s: shared, never the record's)."""
        if i not in self.hooked:
            yield
            return
        flat, _ = tree_flatten(inputs)
        inp_ptrs = set()
        for t in flat:
            if isinstance(t, torch.Tensor):
                ptr = self._ptr(t)
                if ptr is not None and ptr not in self._live and ptr not in self._moving:
                    inp_ptrs.add(ptr)  # a_0 or an input nobody moves: saved as it is
        # the record's new entries, kept here until `recorded(i)`: autograd keeps the pack hook
        # (this closure) as long as any tensor of the record is saved, so the closure must not
        # hold the entries (they would outlive their last handle)
        self._rec[i] = []
        # the record's own tensors become entries when it moves, or when a_i moves (the record
        # may save its output, which `produced(i)` then makes a_i's)
        moves_record = i in self.records or i in self.acts

        def pack(t: torch.Tensor) -> Any:
            ptr = self._ptr(t)
            if ptr is None or ptr in self._fixed or ptr in inp_ptrs:
                return t
            # an input offloaded in this window (the window op reads it) is saved as its entry
            entry = self._live.get(ptr) or self._moving.get(ptr)
            if entry is None:
                if not moves_record:
                    return t
                entry = _Entry(t.untyped_storage(), "record", i)
                self._live[ptr] = entry
                self._rec.setdefault(i, []).append(entry)
            elif entry.kind == "record" and entry.i != i:
                entry.readers.add(i)  # NOTE point 5
            return _Saved(entry, t)

        with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
            yield

    def recorded(self, i: int) -> None:
        """After `R i` and `produced(i, a_i)`: the record keeps only the entries that are not a_i's;
        held weakly here, so `B i` (autograd frees the record's handles) frees them."""
        own = [e for e in self._rec.pop(i, []) if e.kind == "record"]
        self._rec_refs[i] = [weakref.ref(e) for e in own]

    def released(self, i: int) -> None:
        """`B i` ran: record i is gone."""
        self._rec.pop(i, None)
        self._rec_refs.pop(i, None)

    def _ptr(self, t: torch.Tensor) -> int | None:
        """The data pointer of `t`'s storage when it lives on the device and may move, else None."""
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            return None
        if t.layout != torch.strided or t.device != self.device:
            return None
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        return st.data_ptr() if st.nbytes() else None

    def _unpack(self, h: Any) -> torch.Tensor:
        if not isinstance(h, _Saved):
            return h
        e = h.entry
        if e.state == "to_device":
            self._wait(e)
        if e.storage is None or e.state in ("host",):
            name, fetch = _what(e.kind, e.i)
            raise ExecutorError(f"schedule: {name} is on the host when the backward reads it; "
                                f"fetch it ({fetch}) with the op before")
        return torch.empty(0, dtype=h.dtype, device=self.device).set_(e.storage, h.offset, h.size, h.stride)

    # -- activations ----------------------------------------------------------------------------

    def produced(self, i: int, value: Any) -> None:
        """a_i was made (F i or R i): its storages become entries when a_i may move."""
        if i not in self.acts:
            return
        flat, spec = tree_flatten(value)
        leaves: list = []
        for t in flat:
            ptr = self._ptr(t) if isinstance(t, torch.Tensor) else None
            if ptr is None or ptr in self._fixed:
                leaves.append(t)
                continue
            entry = self._live.get(ptr)
            if entry is None:
                entry = _Entry(t.untyped_storage(), "act", i)
                self._live[ptr] = entry
            else:  # saved by record i as its output: a_i's (NOTE point 1)
                entry.kind, entry.i = "act", i
            leaves.append((entry, _Saved(entry, t)))
        self._act[i] = (spec, leaves)

    def dropped(self, i: int, k: int, op: Any) -> None:
        """`drop i`: a_i's entries go (its host copy too); refused with a transfer of it pending."""
        if any(kind in ("offload", "fetch") and j == i for kind, j, _ in self._queued + self._pending):
            raise ExecutorError(f"schedule[{k}] {list(op)}: a transfer of a_{i} is pending; drop it "
                                "after the transfer's window op")
        self._act.pop(i, None)

    def on_host(self, i: int) -> bool:
        """True when a_i's last transfer left it on the host."""
        got = self._act.get(i)
        return got is not None and any(isinstance(x, tuple) and x[0].state in ("to_host", "host")
                                       for x in got[1])

    def record_on_host(self, i: int) -> bool:
        """True when record i's entries are on the host (or on their way)."""
        return any(e.state in ("to_host", "host") for e in self._record_entries(i))

    def _record_entries(self, i: int) -> list[_Entry]:
        if i in self._rec:
            return list(self._rec[i])
        return [e for e in (r() for r in self._rec_refs.get(i, [])) if e is not None]

    def value(self, i: int) -> Any:
        """a_i rebuilt on its entries' current device storages."""
        spec, leaves = self._act[i]
        out = []
        for x in leaves:
            if isinstance(x, tuple):
                e, h = x
                if e.state == "to_device":
                    self._wait(e)
                out.append(self._unpack(h))
            else:
                out.append(x)
        return tree_unflatten(out, spec)

    # -- transfers ------------------------------------------------------------------------------

    def issue(self, k: int, op: Any) -> None:
        """Check the transfer `op` (schedule position k) and queue it for the next window
        (`start_window`, `end_window`)."""
        kind, i = op[0], op[1]
        if kind in ("offload", "fetch"):
            got = self._act.get(i)
            entries = [x[0] for x in got[1] if isinstance(x, tuple)] if got is not None else []
            if got is None:
                raise ExecutorError(f"schedule[{k}] {list(op)}: a_{i} is not live; "
                                    f"{'offload' if kind == 'offload' else 'fetch'} only a kept a_{i}")
        else:
            entries = [e for e in self._record_entries(i) if not e.readers]
            if i not in self._rec_refs and i not in self._rec:
                raise ExecutorError(f"schedule[{k}] {list(op)}: stage {i} has no live record")
        want = "device" if kind in ("offload", "offload_record") else "host"
        for e in entries:
            if e.state != want:
                name, fetch = _what(e.kind, e.i)
                if want == "device":
                    raise ExecutorError(f"schedule[{k}] {list(op)}: {name} is not on the device "
                                        f"({e.state}); {fetch} first")
                raise ExecutorError(f"schedule[{k}] {list(op)}: {name} is not on the host ({e.state})")
        if any(e is f for _, _, es in self._queued for e in entries for f in es):
            raise ExecutorError(f"schedule[{k}] {list(op)}: {_what('act' if kind in ('offload', 'fetch') else 'record', i)[0]} "
                                "already moves in this window")
        self._queued.append((kind, i, entries))

    def start_window(self) -> None:
        """The window op starts: the queued copies start (NOTE point 3). Device bytes of a fetch
        are allocated here, as the chain model counts them from the window op on."""
        for kind, _, entries in self._queued:
            for e in entries:
                (self._to_host if kind in ("offload", "offload_record") else self._to_device)(e)
        self._pending += self._queued
        self._queued = []

    def _to_host(self, e: _Entry) -> None:
        assert e.storage is not None
        src = torch.empty(0, dtype=torch.uint8, device=self.device).set_(e.storage)
        self._live.pop(e.storage.data_ptr(), None)
        self._moving[e.storage.data_ptr()] = e
        if not self.cuda:
            e.host = src.clone()
        else:
            main = torch.cuda.current_stream(self.device)
            e.host = torch.empty(e.nbytes, dtype=torch.uint8, pin_memory=True)
            self._side.wait_stream(main)
            with torch.cuda.stream(self._side):
                e.host.copy_(src, non_blocking=True)
                e.event = torch.cuda.Event()
                e.event.record(self._side)
        self.moved_bytes += e.nbytes
        e.state = "to_host"

    def _to_device(self, e: _Entry) -> None:
        assert e.host is not None
        dst = torch.empty(e.nbytes, dtype=torch.uint8, device=self.device)  # on the main stream
        if not self.cuda:
            dst.copy_(e.host)
        else:
            main = torch.cuda.current_stream(self.device)
            self._side.wait_stream(main)
            with torch.cuda.stream(self._side):
                dst.copy_(e.host, non_blocking=True)
                e.event = torch.cuda.Event()
                e.event.record(self._side)
        e.storage = dst.untyped_storage()
        e.state = "to_device"

    def _wait(self, e: _Entry) -> None:
        """The main stream waits for `e`'s pending copy; the copy's state is settled."""
        if e.event is not None:
            torch.cuda.current_stream(self.device).wait_event(e.event)
            e.event = None
        if e.state == "to_host":
            assert e.storage is not None
            self._moving.pop(e.storage.data_ptr(), None)
            e.storage = None
            e.state = "host"
        elif e.state == "to_device":
            e.host = None
            e.state = "device"
            assert e.storage is not None
            self._live[e.storage.data_ptr()] = e

    def end_window(self) -> list[tuple[str, int]]:
        """The window op ran: the main stream waits on the window's copies; offloaded storages are
        released, fetched ones set. Returns the (op, i) that ended, for the caller's bookkeeping
        (an offloaded a_i's device value is to be replaced by `OnHost(i)`, a fetched one by
        `value(i)`)."""
        done = []
        for kind, i, entries in self._pending:
            for e in entries:
                self._wait(e)
            done.append((kind, i))
        self._pending = []
        return done

    def pending(self) -> bool:
        """True while a transfer waits for its window op or its window's end."""
        return bool(self._pending or self._queued)

    def fetch_pending(self, i: int) -> bool:
        """True while a fetch of a_i waits for its window's end."""
        return any(kind == "fetch" and j == i for kind, j, _ in self._pending)
