"""Choices and defaults the parsers show that the library defines in modules importing torch, written here so that
building the parser stays light (``headwise --help``). tests/test_cli_help.py checks each against the library's own."""

RECOVERY_MODES = ("distill", "finetune", "none")  # headwise.tasks.recovery.MODES
TRAIN_MEMORY_MODES = ("auto", "keep", "bounded")  # headwise.trainer.memory.MEMORY_MODES
# the built-in methods with a sweep (headwise.planning.candidates.plannable()), and the names plan format 1 gave
# four of them (still accepted by --methods for one release)
PLAN_METHODS = ("prune_heads", "gqa", "collaborative", "replace", "quantization")
PLAN_METHOD_RENAMES = {"prune": "prune_heads", "kv_heads": "gqa", "dk": "collaborative", "mechanism": "replace"}
PREFILL_CHUNK = "auto"  # headwise.kvcache.apply.PREFILL_CHUNK
