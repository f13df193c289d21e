"""The real client: torchtune's own ``tune run full_finetune_single_device`` with
``dataset._component_: vecpack.PackedChatDataset`` (and with
``vecpack.torchtune.alpaca_dataset``), on CPU in fp32, for a few steps of a tiny
randomly initialised Qwen2-architecture model saved in HF format."""

from __future__ import annotations

import math
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torchtune")
pytestmark = [pytest.mark.torchtune, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_SEQ_LEN = 256


def _save_tiny_qwen2(out: pathlib.Path) -> dict:
    """A random Qwen2 (Qwen2.5's architecture) with the real 151,936-token vocabulary."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**dims, rope_theta=1_000_000.0, torch_dtype="float32"))
    model.save_pretrained(out, safe_serialization=True)
    assert (out / "model.safetensors").exists()
    return dims


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    ckpt = tmp_path_factory.mktemp("tiny-qwen2")
    return ckpt, _save_tiny_qwen2(ckpt)


def _chat_dataset(tmp: pathlib.Path, data: pathlib.Path) -> str:
    return f"""\
          _component_: vecpack.PackedChatDataset
          source: json
          data_files: {data}
          conversation_column: conversations
          conversation_style: sharegpt
          train_on_input: False
          packed: True
          split: train
          n_jobs: 2
          cache_dir: {tmp / "vecpack-cache"}"""


def _config(tmp: pathlib.Path, ckpt: pathlib.Path, tok_dir: pathlib.Path, dataset: str, d: dict,
            steps: int = 3, max_seq_len: int = MAX_SEQ_LEN) -> str:
    return textwrap.dedent(f"""\
        output_dir: {tmp / "out"}
        model:
          _component_: torchtune.models.qwen2.qwen2
          vocab_size: {d["vocab_size"]}
          num_layers: {d["num_hidden_layers"]}
          num_heads: {d["num_attention_heads"]}
          num_kv_heads: {d["num_key_value_heads"]}
          embed_dim: {d["hidden_size"]}
          intermediate_dim: {d["intermediate_size"]}
          max_seq_len: {d["max_position_embeddings"]}
          norm_eps: {d["rms_norm_eps"]}
          rope_base: 1000000.0
          tie_word_embeddings: True
        tokenizer:
          _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer
          path: {tok_dir / "vocab.json"}
          merges_file: {tok_dir / "merges.txt"}
          max_seq_len: {max_seq_len}
        checkpointer:
          _component_: torchtune.training.FullModelHFCheckpointer
          checkpoint_dir: {ckpt}
          checkpoint_files: [model.safetensors]
          recipe_checkpoint: null
          output_dir: ${{output_dir}}
          model_type: QWEN2
        resume_from_checkpoint: False
        dataset:
{dataset}
        seed: 0
        shuffle: True
        epochs: 1
        max_steps_per_epoch: {steps}
        batch_size: 2
        gradient_accumulation_steps: 1
        optimizer:
          _component_: torch.optim.AdamW
          fused: False
          lr: 1e-3
        optimizer_in_bwd: False
        loss:
          _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
        device: cpu
        dtype: fp32
        enable_activation_checkpointing: False
        enable_activation_offloading: False
        clip_grad_norm: null
        compile: False
        metric_logger:
          _component_: torchtune.training.metric_logging.DiskLogger
          log_dir: ${{output_dir}}/logs
        log_every_n_steps: 1
        log_peak_memory_stats: False
        profiler:
          _component_: torchtune.training.setup_torch_profiler
          enabled: False
        """)


def _tune_run(tmp: pathlib.Path, config: str) -> tuple[list[float], str]:
    """``tune run full_finetune_single_device --config config``: the losses it logged, and its output."""
    cfg = tmp / "config.yaml"
    cfg.write_text(config)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")
    # `python -m torchtune._cli.tune` is torchtune's `tune` entry point; called this way because
    # Ray installs a console script of the same name that can shadow it on PATH.
    proc = subprocess.run([sys.executable, "-m", "torchtune._cli.tune", "run", "full_finetune_single_device",
                           "--config", str(cfg)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    logs = list((tmp / "out" / "logs").glob("*.txt"))
    assert logs, f"no DiskLogger output\n{out[-3000:]}"
    text = "".join(p.read_text() for p in logs)
    losses = [float(x) for x in re.findall(r"\bloss:\s*([-+0-9.eEnaif]+)", text)]
    assert all(math.isfinite(x) and x > 0 for x in losses), losses
    # the recipe used vecpack's packs (and their collator) rather than building its own dataset
    assert "vecpack" in out and "Packing dataset" not in out, out[-3000:]
    return losses, out


def test_tune_run_full_finetune_single_device(tmp_path, qwen_dir, tiny_qwen2):
    from vecpack.testing import make_sharegpt

    ckpt, dims = tiny_qwen2
    data = pathlib.Path(make_sharegpt(tmp_path / "train.jsonl", 200, seed=7, median_assistant=150))
    losses, _ = _tune_run(tmp_path, _config(tmp_path, ckpt, qwen_dir, _chat_dataset(tmp_path, data), dims))
    assert len(losses) == 3, losses
    # a random model over a 151,936-token vocabulary starts near ln(V)
    assert abs(losses[0] - math.log(dims["vocab_size"])) < 2.0, losses


def test_tune_run_with_alpaca_dataset(tmp_path, qwen_dir, tiny_qwen2):
    """``_component_: vecpack.torchtune.alpaca_dataset`` in place of torchtune's, same keys."""
    from vecpack.testing import make_rows

    ckpt, dims = tiny_qwen2
    data = make_rows(tmp_path / "alpaca.jsonl", 120, style="alpaca", seed=3, median=200)
    dataset = f"""\
          _component_: vecpack.torchtune.alpaca_dataset
          source: json
          data_files: {data}
          packed: True
          split: train
          cache_dir: {tmp_path / "vecpack-cache"}"""
    losses, _ = _tune_run(tmp_path, _config(tmp_path, ckpt, qwen_dir, dataset, dims, steps=2, max_seq_len=128))
    assert len(losses) == 2, losses
    assert abs(losses[0] - math.log(dims["vocab_size"])) < 2.0, losses
