"""A site policy plugin: no backend, only rules of the cluster it is installed on.

"On our cluster always use spawn" and "always set NCCL_DEBUG=WARN"; and a setup hook that
records, in each worker, that it ran (a file named after the rank and process id, in the
folder SITE_POLICY_RECORD names).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hwlaunch import hookimpl

if TYPE_CHECKING:  # this module is loaded in every worker too: it imports only what it runs
    from hwlaunch import PlanDraft, Worker

HWLAUNCH_CONTRACT = "1.0"


@hookimpl
def hwlaunch_adjust_plan(draft: PlanDraft) -> None:
    draft.propose("start_method", "spawn", "on our cluster always use spawn")
    draft.propose("env", {"NCCL_DEBUG": "WARN", "SITE_POLICY": "on"}, "site defaults")


@hookimpl
def hwlaunch_worker_setup(worker: Worker) -> None:
    folder = os.environ.get("SITE_POLICY_RECORD")
    if folder:
        record = Path(folder, f"rank{worker.rank}-pid{os.getpid()}")
        with record.open("x") as out:  # "x": a second call in the same worker fails loudly
            json.dump(
                {"device_before_setup": worker.device, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG")},
                out,
            )
