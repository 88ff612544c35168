"""One vLLM engine, run in vLLM's environment (no headwise there): ``python engine.py JOB.json OUT.json``.

JOB: ``{"model": folder, "engine": {LLM keywords}, "env": {variables for vLLM}, "prompts": [[token ids], ...], "max_tokens": n, "logprobs": k}``
(``prompts`` may be empty: the engine's KV accounting only). OUT: ``{"tokens": [[ids]], "logprobs": [[{id: logprob}
per step]], "kv_cache_tokens": int, "max_concurrency": float, "groups": [[kind, window, layers], ...],
"architecture": str}``: the greedy tokens, the top-k log-probabilities of each step, and vLLM's own accounting of its
KV cache (what it logs as "KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx").
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its config readable


def main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(open(job_path, encoding="utf-8").read())
    os.environ.update(job.get("env", {}))  # read by vLLM's workers, which start after this
    llm = LLM(model=job["model"], **job.get("engine", {}))
    config = llm.llm_engine.vllm_config
    core = llm.llm_engine.engine_core.engine_core
    groups = [[type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None), len(g.layer_names)]
              for g in core.scheduler.kv_cache_config.kv_cache_groups]
    out = {"kv_cache_tokens": config.cache_config.kv_cache_size_tokens,
           "max_concurrency": config.cache_config.kv_cache_max_concurrency,
           "num_blocks": core.scheduler.kv_cache_config.num_blocks, "groups": groups,
           "architecture": config.model_config.architectures[0], "tokens": [], "logprobs": []}
    if job.get("prompts"):
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], logprobs=job.get("logprobs", 0),
                                ignore_eos=True)
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
        for result in results:
            completion = result.outputs[0]
            out["tokens"].append(list(completion.token_ids))
            out["logprobs"].append([{str(t): lp.logprob for t, lp in step.items()}
                                    for step in (completion.logprobs or [])])
    open(out_path, "w", encoding="utf-8").write(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
