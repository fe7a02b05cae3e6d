"""A script WITHOUT a main guard: it launches at module level, as many real scripts do.

argv[1] is a JSON object of extra resolve() keywords, e.g. '{"start_method": "spawn"}'.
"""

import json
import sys
import warnings

import hwlaunch

warnings.simplefilter("always")
extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
executor = hwlaunch.launch(backend="cpu", world_size=2, **extra)  # the launch line
ranks = executor.collective_rpc(lambda worker: worker.rank)
plan = executor.plan
guard = plan.facts.main_guard if plan.facts is not None else None
print(
    json.dumps(
        {
            "start_method": plan.start_method,
            "start_method_reason": plan.decision("start_method").reason,
            "ranks": ranks,
            "warnings": list(plan.warnings),
            "main_guard": [guard.status, guard.file, guard.line] if guard else None,
        }
    ),
    flush=True,
)
executor.shutdown()
