"""A driver that generates until it is killed (argv[1]: the model; argv[2]: TP).

Prints the workers' pids as JSON once the engine is ready, then "generating" before each
long ``generate``: the test kills it there.
"""

import sys

from common import ENGINE, PROMPTS, dist_ident, report

if __name__ == "__main__":
    from vllm import SamplingParams

    from hwlaunch.integrations.vllm import LLM

    llm = LLM(sys.argv[1], tensor_parallel_size=int(sys.argv[2]), **ENGINE)
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    report(pids=executor.pids, ident=dist_ident(llm))
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    while True:
        print("generating", flush=True)
        llm.generate(PROMPTS * 8, params, use_tqdm=False)
