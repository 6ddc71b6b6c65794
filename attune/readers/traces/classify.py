"""How trace events are classified: device event classes, communication kinds, host activity.

Device (GPU) events, first match wins, as Holistic Trace Analysis classifies kernels so that the
HTA-comparable figures mean the same thing:

- communication: the name starts with ``nccl`` and later contains ``Kernel``
  (``ncclKernel_AllReduce_...``, ``ncclDevKernel_SendRecv``);
- memory: the name starts with ``Memcpy``, ``Memset`` or ``dma``;
- other: the name contains ``Memcpy`` or ``Sync``, or starts with ``Memset`` (synchronisation
  markers and odd copies: neither compute nor communication);
- computation: everything else.

Communication kinds say what a rank waits on. A collective is named by the kernel's
``Collective name`` argument when the trace has it, else by the kernel or operator name; the
process group (its description, or its ranks against the run's layout) tells which parallel
dimension it spans.
"""

from __future__ import annotations

import re
from enum import IntEnum

__all__ = [
    "CommKind",
    "DeviceClass",
    "HostClass",
    "comm_kind",
    "cpu_comm_collective",
    "device_class",
    "group_dim_from_desc",
    "host_class",
]


class DeviceClass(IntEnum):
    COMPUTE = 0
    COMM = 1
    MEMORY = 2
    OTHER = 3


class CommKind(IntEnum):
    """What a communication operation is for; the order is the attribution priority."""

    PIPELINE_P2P = 0
    ALL_TO_ALL = 1
    TP_COLLECTIVE = 2
    CP_COLLECTIVE = 3
    DP_REDUCE = 4
    OTHER = 5

    @property
    def label(self) -> str:
        return _KIND_LABELS[self]


_KIND_LABELS = {
    CommKind.PIPELINE_P2P: "pipeline_p2p",
    CommKind.ALL_TO_ALL: "all_to_all",
    CommKind.TP_COLLECTIVE: "tp_collective",
    CommKind.CP_COLLECTIVE: "cp_collective",
    CommKind.DP_REDUCE: "dp_reduce",
    CommKind.OTHER: "other_comm",
}


class HostClass(IntEnum):
    """What the host is doing; the order is the attribution priority for device idle time."""

    DATA_LOADING = 0
    SYNC_WAIT = 1
    LAUNCH = 2


_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"^(?:Memcpy|Memset|dma)")
_OTHER_RE = re.compile(r"^nccl.*Kernel|.*Memcpy|Memset|.*Sync")


def device_class(name: str) -> DeviceClass:
    if _COMM_RE.match(name):
        return DeviceClass.COMM
    if _MEMORY_RE.match(name):
        return DeviceClass.MEMORY
    if _OTHER_RE.match(name):
        return DeviceClass.OTHER
    return DeviceClass.COMPUTE


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


# Normalised collective names (lower case, no punctuation) -> operation family.
_P2P = ("sendrecv", "send", "recv", "isend", "irecv", "batchisendirecv", "p2p")
_A2A = ("alltoall", "alltoallv", "alltoallbase", "alltoallsingle")
_REDUCE_LIKE = (
    "allreduce",
    "allgather",
    "reducescatter",
    "reduce",
    "broadcast",
    "gather",
    "scatter",
    "coalesced",
)


def _family(collective: str) -> str:
    c = _norm(collective)
    if any(c.startswith(a) for a in _A2A) or "alltoall" in c:
        return "a2a"
    if c in _P2P or c.startswith(("send", "recv", "sendrecv")) or "isendirecv" in c:
        return "p2p"
    if any(r in c for r in _REDUCE_LIKE):
        return "reduce"
    if "barrier" in c:
        return "barrier"
    return "unknown"


def _family_from_kernel(name: str) -> str:
    n = _norm(name)
    for marker, fam in (
        ("alltoall", "a2a"),
        ("sendrecv", "p2p"),
        ("send", "p2p"),
        ("recv", "p2p"),
        ("allreduce", "reduce"),
        ("reducescatter", "reduce"),
        ("allgather", "reduce"),
        ("broadcast", "reduce"),
        ("reduce", "reduce"),
    ):
        if marker in n:
            return fam
    return "unknown"


def group_dim_from_desc(desc: str | None) -> str | None:
    """The parallel dimension a process group spans, from its description if it names one."""
    if not desc:
        return None
    d = desc.upper()
    if "PIPELINE" in d or re.search(r"(^|[^A-Z])PP([^A-Z]|$)", d):
        return "pp"
    if "EXPERT" in d or re.search(r"(^|[^A-Z])EP([^A-Z]|$)", d):
        return "ep"
    if "CONTEXT" in d or re.search(r"(^|[^A-Z])CP([^A-Z]|$)", d):
        return "cp"
    if "TENSOR" in d or re.search(r"(^|[^A-Z])TP([^A-Z]|$)", d):
        return "tp"
    if "DATA" in d or re.search(r"(^|[^A-Z])DP([^A-Z]|$)", d):
        return "dp"
    return None


def comm_kind(collective: str | None, kernel_or_op_name: str, group_dim: str | None) -> CommKind:
    """Classify a communication operation.

    ``group_dim`` is the dimension its process group spans (``pp``, ``tp``, ``cp``, ``ep``,
    ``dp``) when known. Point-to-point traffic is pipeline traffic unless its group says
    otherwise; all-to-all is the expert dispatch; reductions, gathers and broadcasts go to the
    dimension of their group, and to data parallelism when the group is unknown (documented).
    """
    fam = _family(collective) if collective else "unknown"
    if fam == "unknown":
        fam = _family_from_kernel(kernel_or_op_name)
    if fam == "a2a":
        return CommKind.ALL_TO_ALL
    if group_dim == "tp":
        return CommKind.TP_COLLECTIVE
    if group_dim == "cp":
        return CommKind.CP_COLLECTIVE
    if fam == "p2p":
        if group_dim in (None, "pp"):
            return CommKind.PIPELINE_P2P
        return CommKind.OTHER
    if fam in ("reduce", "unknown"):
        if group_dim == "ep":
            return CommKind.ALL_TO_ALL
        if fam == "reduce" and group_dim != "pp":
            return CommKind.DP_REDUCE
    return CommKind.OTHER


_CPU_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "c10d:", "mpi:", "ucc:")


def cpu_comm_collective(name: str) -> str | None:
    """For a CPU-side event: the collective it performs if it is communication, else None.

    ``gloo:all_reduce`` and ``gloo:recv`` are the gloo backend's work (on CPU-only traces they
    are the communication itself); ``c10d::allreduce_`` and friends are the calls that enqueue it;
    ``record_param_comms`` carries its collective in its arguments.
    """
    if name == "record_param_comms":
        return ""
    for prefix in _CPU_COMM_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return None


_SYNC_NAMES = ("Synchronize", "cudaMemcpy", "hipMemcpy", "cuMemcpy")
_DATA_RE = re.compile(r"DataLoader|dataloader|data_load|DataLoad")


def host_class(cat: str, name: str) -> HostClass | None:
    """Host events that explain device idle time; None for everything else.

    Data loading: an annotation or operator naming the DataLoader. Synchronisation: runtime
    calls that block the host on the device (``cudaStreamSynchronize``, a synchronous
    ``cudaMemcpy``...). Launch: every other runtime or driver call (kernel launches, event
    records, allocator calls).
    """
    if _DATA_RE.search(name):
        return HostClass.DATA_LOADING
    if cat in ("cuda_runtime", "cuda_driver", "hip_runtime", "mtia_runtime", "Runtime"):
        if any(s in name for s in _SYNC_NAMES) and "Async" not in name:
            return HostClass.SYNC_WAIT
        return HostClass.LAUNCH
    return None
