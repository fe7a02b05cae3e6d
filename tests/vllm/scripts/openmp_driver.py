"""A driver that ran a parallel torch op (GNU OpenMP's pool started) before LLM(...).

argv[1]: the model. Prints the plan's start method with its reason, and the tokens.
"""

import sys

from common import ENGINE, report, token_ids

if __name__ == "__main__":
    import torch

    torch.set_num_threads(2)
    torch.ones(512, 512) @ torch.ones(512, 512)  # starts the OpenMP pool in this process

    from hwlaunch.integrations.vllm import LLM

    llm = LLM(sys.argv[1], tensor_parallel_size=2, **ENGINE)
    decision = llm.plan.decision("start_method")
    report(
        start_method=llm.plan.start_method,
        reason=decision.reason,
        source=decision.source,
        tokens=token_ids(llm),
    )
