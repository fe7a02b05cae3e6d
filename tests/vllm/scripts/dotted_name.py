"""vllm.LLM itself, with the executor by its dotted name (argv[1]: the model).

The engine core is vLLM's own process here (VLLM_ENABLE_V1_MULTIPROCESSING at its default),
and the executor runs in it: the plan is resolved there.
"""

import sys

from common import ENGINE, report, token_ids

if __name__ == "__main__":
    import vllm

    llm = vllm.LLM(
        sys.argv[1],
        tensor_parallel_size=2,
        distributed_executor_backend="hwlaunch.integrations.vllm.HwlaunchExecutor",
        **ENGINE,
    )
    report(tokens=token_ids(llm))
