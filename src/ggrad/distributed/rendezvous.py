"""The rendezvous every collective begins with.

The ranks first agree that they call the same collective on tensors of the same dtypes
and shapes: otherwise MPI or NCCL returns garbage (float32 reduced with int32) or fails
with MPI's own error stack. While a rank waits there, it also listens for ranks that
left the job (their process ended, by `sys.exit` or by returning, or they destroyed
the process group): a rank that left before this collective will never join it, so the
job ends with a message naming that rank instead of waiting forever."""

from __future__ import annotations

import hashlib
import sys
import time
from typing import NamedTuple

import numpy as np

_LEFT_TAG = 24  # the tag of the message a rank sends to every other when it leaves
_DRAIN_SECONDS = 1.0  # how long an ending job waits for its last output to be forwarded


class Fingerprint(NamedTuple):
    """What a rank calls: the collective, its options, its tensors' dtypes and shapes."""
    collective: str
    options: tuple = ()
    dtypes: tuple = ()
    shapes: tuple = ()

    def __str__(self) -> str:
        parts = [f"{name}={value}" for name, value in self.options]
        if self.dtypes:
            parts.append("tensors=[" + ", ".join(f"{d} {tuple(s)}" for d, s in zip(self.dtypes, self.shapes)) + "]")
        return f"{self.collective}({', '.join(parts)})"

    def differences(self, other: Fingerprint) -> list[str]:
        aspects = [("collective", self.collective, other.collective), ("options", self.options, other.options),
                   ("number of tensors", len(self.dtypes), len(other.dtypes)),
                   ("tensor dtypes", self.dtypes, other.dtypes), ("tensor shapes", self.shapes, other.shapes)]
        return [f"{name}: {mine} vs {theirs}" for name, mine, theirs in aspects if mine != theirs]

    def hash62(self) -> int:
        """A hash below 2**62, so that its negation fits an int64 too."""
        return int.from_bytes(hashlib.blake2b(repr(self).encode(), digest_size=8).digest(), "little") >> 2


class CollectiveMismatch(RuntimeError):
    """The ranks called different collectives, or the same one on different tensors.
    `fingerprints[r]` is what rank r called."""

    def __init__(self, rank: int, fingerprints: list[Fingerprint]) -> None:
        mine = fingerprints[rank]
        other = next(r for r, f in enumerate(fingerprints) if f != mine)
        super().__init__(f"Detected mismatch between collectives on ranks. Rank {rank} is running collective: "
                         f"{mine}, but Rank {other} is running collective: {fingerprints[other]}. Collectives "
                         f"differ in the following aspects: {'; '.join(mine.differences(fingerprints[other]))}. "
                         "Every rank must call the same collectives, in the same order, on tensors of the same "
                         "dtypes and shapes")
        self.fingerprints = fingerprints


def abort_job(comm) -> None:
    """End every rank, after what this one wrote had time to reach mpiexec.

    MPICH's hydra forwards a rank's output through its proxy; an MPI_Abort can end the
    job before the proxy forwards what was written just before it, and the user sees an
    empty log (2 runs in 30 on a loaded 2-core machine). A pause lets the proxy drain."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_DRAIN_SECONDS)
    comm.Abort(1)


class Lifeline:
    """This rank's count of collectives, and the ranks that left with theirs.

    Messages about leaving travel on a communicator of their own, so they never match a
    collective's. One receive for them is always posted; waiting for a collective also
    waits for it."""

    def __init__(self, comm, MPI) -> None:
        self.MPI, self.comm, self.notices = MPI, comm, comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.started = 0  # collectives this rank has entered
        self.left: dict[int, int] = {}  # rank -> collectives it had entered when it left
        self._message = np.zeros(1, np.int64)
        self._listen()

    def _listen(self) -> None:
        self._receive = self.notices.Irecv(self._message, source=self.MPI.ANY_SOURCE, tag=_LEFT_TAG)

    def _heard(self, status) -> None:
        self.left[status.Get_source()] = int(self._message[0])
        self._listen()

    def _end_job_if_abandoned(self, collective: str) -> None:
        """A rank that left before entering this collective will never join it: end the job."""
        abandoned = {r: n for r, n in self.left.items() if n < self.started}
        if not abandoned:
            return
        rank, entered = min(abandoned.items())
        sys.stderr.write(
            f"ggrad.distributed: rank {rank} left the job (its process ended, or it destroyed the process "
            f"group) after {entered} collectives, while rank {self.rank} waits in collective number "
            f"{self.started} ({collective}), which rank {rank} will never join (init_process_group counts as the "
            "first). Every rank must call the same collectives; ending the job.\n")
        abort_job(self.comm)

    def wait(self, request, collective: str) -> None:
        """Wait for `request` (this rank's part of `collective`) unless a rank it needs has left."""
        status = self.MPI.Status()
        while True:
            self._end_job_if_abandoned(collective)
            if self.MPI.Request.Waitany([request, self._receive], status) == 0:
                return
            self._heard(status)

    def leave(self) -> None:
        """Tell every other rank how many collectives this one entered (it enters no more)."""
        count = np.array([self.started], np.int64)
        for rank in range(self.size):
            if rank != self.rank:
                self.notices.Send(count, dest=rank, tag=_LEFT_TAG)
        self._receive.Cancel()
        self._receive.Wait()


def agree(lifeline: Lifeline, fingerprint: Fingerprint) -> None:
    """Enter the next collective: every rank must call it with an equal `fingerprint`
    (else CollectiveMismatch on every rank). Once this returns, every rank is in it."""
    lifeline.started += 1
    h = fingerprint.hash62()
    extremes = np.empty(2, np.int64)  # the largest hash and minus the smallest, in one reduction
    lifeline.wait(lifeline.comm.Iallreduce(np.array([h, -h], np.int64), extremes, op=lifeline.MPI.MAX),
                  fingerprint.collective)
    if extremes[0] != -extremes[1]:
        raise CollectiveMismatch(lifeline.rank, lifeline.comm.allgather(fingerprint))
