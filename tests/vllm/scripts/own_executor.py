"""vLLM's own mp executor at TP 1 and 2: the reference tokens (argv[1]: the model)."""

import os
import sys

from common import ENGINE, report, token_ids

if __name__ == "__main__":
    import vllm

    tokens = {}
    for tp in (1, 2):
        # vLLM's executor refuses TP=2 on one NUMA node without a binding of the user's.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if tp == 2 else "0-1"
        llm = vllm.LLM(
            sys.argv[1], tensor_parallel_size=tp, distributed_executor_backend="mp", **ENGINE
        )
        tokens[tp] = token_ids(llm)
        llm.llm_engine.engine_core.shutdown()
        del llm
    report(tokens=tokens)
