"""Choices and defaults the parsers show that the library defines in modules importing torch (tasks, the trainer,
the KV cache runtime; none of a method: methods declare theirs, ``headwise.declaration``), written here so that
building the parser stays light (``headwise --help``). tests/test_cli_help.py checks each against the library's own."""

RECOVERY_MODES = ("distill", "finetune", "none")  # headwise.training.recovery.MODES
TRAIN_MEMORY_MODES = ("auto", "keep", "bounded")  # headwise.training.memory.MEMORY_MODES
PREFILL_CHUNK = "auto"  # headwise.kvcache.generation.PREFILL_CHUNK
