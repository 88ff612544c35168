"""Edited folders where users take them next: transformers' Auto classes and pipelines (``auto``: what a sealed
folder's ``auto_map`` names, used with ``trust_remote_code=True``) and lm-evaluation-harness (``lm_eval``: the
``headwise`` model type, ``python -m headwise.clients.lm_eval``). Imported only by those clients."""
