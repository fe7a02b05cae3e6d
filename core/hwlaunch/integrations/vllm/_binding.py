"""Which CPUs each rank of a vLLM job on the CPU platform runs its OpenMP threads on.

Why: vLLM's own CPU executor binds one NUMA node per rank ("auto") and refuses tensor
parallelism on a machine with one node until ``VLLM_CPU_OMP_THREADS_BIND`` is set by hand.
hwlaunch already gives each worker its share of this process's CPUs (the thread budget); here
that share becomes a CPU set per rank, written the way vLLM reads the variable (``0-3|4-7``: one
list per local rank, ``|`` between ranks), so one plan shows it and every worker reads its own
part. A binding the user set wins; ``nobind`` turns binding off. Pure: no environment access.
"""

from __future__ import annotations

from collections.abc import Sequence

from hwlaunch import ConfigError

__all__ = ["BIND_VAR", "binding_text", "parse_binding", "share_cpus"]

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
NO_BINDING = "nobind"
AUTO = "auto"  # vLLM's default: one NUMA node per rank; here: hwlaunch's share per rank


def share_cpus(allowed: Sequence[int], ranks: int, per_rank: int) -> list[list[int]]:
    """``ranks`` CPU sets of ``per_rank`` CPUs each, taken in order from ``allowed`` (this
    process's affinity); more ranks than CPUs share them round the list."""
    if not allowed:
        raise ValueError("no CPUs to share: the process's affinity is empty")
    cpus = sorted(allowed)
    per_rank = max(1, per_rank)
    return [
        [cpus[(rank * per_rank + i) % len(cpus)] for i in range(per_rank)] for rank in range(ranks)
    ]


def binding_text(cpu_sets: Sequence[Sequence[int]]) -> str:
    """The sets as vLLM's variable writes them: ``0,1|2,3``."""
    return "|".join(",".join(str(cpu) for cpu in cpus) for cpus in cpu_sets)


def parse_binding(text: str, ranks: int, source: str) -> list[list[int]] | None:
    """The CPU set of each local rank from a binding such as ``0-1|2,3``; None for ``nobind``.

    A binding that names a different number of ranks, or holds something other than CPU ids
    and ranges, is a ConfigError naming the value, where it came from, and the fix.
    """
    if text.strip() == NO_BINDING:
        return None
    parts = text.split("|")
    if len(parts) != ranks:
        raise ConfigError(
            f"{BIND_VAR}={text!r} ({source}) lists {len(parts)} CPU set(s) for {ranks} local "
            f"rank(s). Fix: give one set per rank, separated by '|' (e.g. "
            f"{'|'.join(str(r) for r in range(ranks))!r}), '{NO_BINDING}', or unset it to let "
            "hwlaunch share this process's CPUs between the ranks"
        )
    return [_cpu_list(part, text, source) for part in parts]


def _cpu_list(part: str, text: str, source: str) -> list[int]:
    cpus: list[int] = []
    try:
        for item in part.split(","):
            low, _, high = item.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError(item)
            cpus.extend(range(first, last + 1))
    except ValueError:
        raise ConfigError(
            f"{BIND_VAR}={text!r} ({source}): {part!r} is not a list of CPU ids and ranges. "
            "Fix: write each rank's CPUs as ids and ranges, e.g. '0-3,8|4-7,9'"
        ) from None
    return cpus
