"""vLLM plugin of headwise: registers the model classes that serve a per-KV-head cache policy.

A folder that ``headwise.clients.vllm.export_vllm`` wrote for a policy with heads of different rules names one of
``ARCHITECTURES`` in its ``config.json`` and carries the policy under ``POLICY_KEY``. vLLM loads this module in every
process through the ``vllm.general_plugins`` entry point; the classes import lazily (``module:Class`` strings).
"""

# config.json: {"format": FORMAT, "version": 1 or 2, "sliding_window": [[int|None]], and in version 2
# "sink_logit": [[[float per query head]|None per KV head] per layer] or None}
POLICY_KEY = "headwise_kv_policy"
VERSIONS = (1, 2)
FORMAT = "headwise-kv-policy-vllm"
# the plugin's architecture → the vLLM class it extends (module, class)
ARCHITECTURES = {
    "HeadwiseLlamaForCausalLM": ("vllm.model_executor.models.llama", "LlamaForCausalLM"),
    "HeadwiseMistralForCausalLM": ("vllm.model_executor.models.mistral", "MistralForCausalLM"),
    "HeadwiseQwen2ForCausalLM": ("vllm.model_executor.models.qwen2", "Qwen2ForCausalLM"),
}


def register() -> None:
    """The entry point: each architecture of ``ARCHITECTURES`` served by ``headwise_vllm.model``."""
    from vllm import ModelRegistry

    for name in ARCHITECTURES:
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, f"headwise_vllm.model:{name}")
