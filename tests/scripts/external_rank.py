"""One rank under torchrun: ``hwlaunch.launch()`` with no arguments, at module level.

No main guard on purpose: the external executor starts no process, so nothing re-imports this
file. Each rank writes what it saw to ``$HWL_OUT/rank<N>.json``.
"""

import json
import os
import sys

import psutil

import hwlaunch

executor = hwlaunch.launch()
rank = executor.rank
sums = executor.collective_rpc("all_reduce_rank")
me = psutil.Process()
# Both ranks are alive here: each waits for the other in the all-reduce below before it exits.
agent_children = sorted(p.pid for p in me.parent().children())
own_children = [p.pid for p in me.children(recursive=True)]
try:
    executor.collective_rpc(lambda w: 1 / (w.rank - w.rank))
    error = None
except hwlaunch.WorkerError as exc:
    error = {"rank": exc.rank, "type": exc.exc_type, "traceback": exc.remote_traceback}
only_rank_1 = executor.collective_rpc(lambda w: w.rank + 10, unique_reply_rank=1)
later = executor.collective_rpc(lambda w: w.rank, non_block=True)
executor.collective_rpc("all_reduce_rank")
executor.shutdown()
with open(os.path.join(os.environ["HWL_OUT"], f"rank{rank}.json"), "w") as out:
    json.dump(
        {
            "pid": os.getpid(),
            "rank": rank,
            "plan": executor.plan.to_dict(),
            "sums": sums,
            "agent_children": agent_children,
            "own_children": own_children,
            "error": error,
            "only_rank_1": only_rank_1,
            "non_block": later.result(),
        },
        out,
    )
sys.exit(0)
