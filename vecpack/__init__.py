"""vecpack: tokenize and pack fine-tuning data on every core, into attention-ready sequences.

This module is the public API. Where each piece lives is in
``docs/architecture.md``.

>>> import numpy as np, vecpack
>>> tokens = np.arange(1, 8, dtype=np.int32)
>>> offsets = np.array([0, 3, 5, 7], dtype=np.int64)
>>> packed = vecpack.pack(tokens, offsets, max_len=4, strategy="greedy")
>>> len(packed), packed[0]["input_ids"].tolist()
(2, [1, 2, 3, 0])

Every name but the errors is imported on first use, so ``import vecpack`` stays
light (and a tokenizer worker loads only what it runs).
"""

from vecpack._lazy import lazy_names
from vecpack._version import __version__ as __version__
from vecpack.errors import EncoderError as EncoderError
from vecpack.errors import InputError as InputError
from vecpack.errors import UselessOutputError as UselessOutputError
from vecpack.errors import VecpackError as VecpackError
from vecpack.errors import WorkerDiedError as WorkerDiedError

# name -> the module that defines it, imported on first use (a tokenizer worker, which
# imports vecpack.tokenizing, then loads neither the packer nor the cache)
_LAZY = {
    "Packed": "vecpack.packing.packed",
    "Plan": "vecpack.packing.plan",
    "RolloutPack": "vecpack.packing.tree",
    "Source": "vecpack.packing.mix",
    "build": "vecpack.pipeline.build",
    "build_on_cluster": "vecpack.pipeline.build",
    "load": "vecpack.pipeline.saved",
    "pack": "vecpack.packing.packed",
    "plan": "vecpack.packing.plan",
    "pack_rollouts": "vecpack.packing.tree",
    "save": "vecpack.pipeline.saved",
    "DocumentMeanLoss": "vecpack.integrations.loss",
    "FlexBatch": "vecpack.integrations.collate",
    "PackedChatDataset": "vecpack.torchtune.chat",
    "PackedDataset": "vecpack.torchtune.packed",
    "PackedPairs": "vecpack.packing.pairs",
    "StreamingPackedDataset": "vecpack.streaming.dataset",
    "Tokenized": "vecpack.tokenizing.tokenized",
    "check_trainer": "vecpack.integrations.hf",
    "collate_flash": "vecpack.integrations.collate",
    "collate_flex": "vecpack.integrations.collate",
    "collate_preference": "vecpack.integrations.collate",
    "collate_torchtune": "vecpack.integrations.collate",
    "collate_turns": "vecpack.integrations.collate",
    "collate_vision": "vecpack.integrations.collate",
    "dpo_loss": "vecpack.integrations.loss",
    "hf_dataset": "vecpack.integrations.hf",
    "pack_pairs": "vecpack.packing.pairs",
    "sequence_logps": "vecpack.integrations.loss",
    "tokenize": "vecpack.pipeline.build",
    "BalancedSampler": "vecpack.integrations.ranks",
    "BalancedSteps": "vecpack.packing.balance",
    "attention_coefficient": "vecpack.packing.balance",
    "balance": "vecpack.packing.balance",
    "balance_items": "vecpack.packing.balance",
    "use_balanced_sampler": "vecpack.integrations.ranks",
    "TreeGRPOMixin": "vecpack.integrations.rl",
    "policy_loss": "vecpack.integrations.rl",
    "rollout_logprobs": "vecpack.integrations.rl",
    "rollout_model_inputs": "vecpack.integrations.rl",
    "collate_cp": "vecpack.integrations.ranks",
    "cp_pad_multiple": "vecpack.options",
    "export_megatron": "vecpack.integrations.export",
}

__all__ = sorted([
    "EncoderError", "InputError", "Packed", "Plan", "Source", "UselessOutputError", "VecpackError",
    "WorkerDiedError", "__version__",
    "build", "load", "pack", "plan", "save", *_LAZY,
])


__getattr__, __dir__ = lazy_names("vecpack", _LAZY, globals())
