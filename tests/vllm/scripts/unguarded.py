"""A user's first script: LLM(model, tensor_parallel_size=2) at module level, no main guard.

argv[1]: the model. Prints the plan's start method, the tokens and each rank's CPUs.
"""

import sys

from common import ENGINE, dist_ident, rank_cpus, report, token_ids

from hwlaunch.integrations.vllm import LLM

llm = LLM(sys.argv[1], tensor_parallel_size=2, **ENGINE)
report(
    start_method=llm.plan.start_method,
    tokens=token_ids(llm),
    cpus=rank_cpus(llm),
    ident=dist_ident(llm),
)
