"""Fixtures of the vision tests: a processor directory as a checkpoint ships it, images, rows, tiny models.

Everything is offline: the tokenizer is vecpack's Qwen2.5 fixture (it has the
vision tokens), the image processor is built from arguments, the chat template
is Qwen2-VL-Instruct's, the models are random and built from configs.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil

import numpy as np

from vecpack.testing import cached_tokenizer_dir

# Qwen2-VL-Instruct's chat template (images and videos; add_vision_id as the checkpoint has it).
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Small images keep the tiny models fast: 4 to 64 merged tokens an image.
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 64
IMAGE_CONFIG = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": MIN_PIXELS,
                "max_pixels": MAX_PIXELS, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}

# (width, height): squares, wide and tall, tiny (scaled up) and large (scaled down), odd sizes.
SIZES = [(56, 56), (100, 60), (40, 300), (333, 77), (17, 23), (640, 480), (120, 121), (29, 500), (250, 250),
         (64, 200)]


def make_processor_dir(out, *, template: str = QWEN2_VL_TEMPLATE, image_config: dict | None = None) -> pathlib.Path:
    """A processor directory: ``preprocessor_config.json``, the Qwen2.5 tokenizer files, ``chat_template.jinja``."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in cached_tokenizer_dir().iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".json"):
            shutil.copy(f, out / f.name)
    (out / "preprocessor_config.json").write_text(json.dumps(image_config or IMAGE_CONFIG))
    (out / "chat_template.jinja").write_text(template)
    return out


# A LLaVA-style checkpoint: CLIP's processor (every image 56 x 56, 4 x 4 patches of 14 and a CLS token the
# "default" strategy drops: 16 tokens an image), an ``<image>`` token, the same template with ``<image>``.
LLAVA_TEMPLATE = QWEN2_VL_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
LLAVA_IMAGE_CONFIG = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 56},
                      "crop_size": {"height": 56, "width": 56}, "do_center_crop": True}
LLAVA_PROCESSOR_CONFIG = {"processor_class": "LlavaProcessor", "patch_size": 14,
                          "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1,
                          "image_token": "<image>"}


def make_llava_dir(out) -> pathlib.Path:
    """A LLaVA-style processor directory: the Qwen2.5 tokenizer plus an ``<image>`` token, CLIP's preprocessing."""
    from transformers import AutoTokenizer

    out = pathlib.Path(out)
    tok = AutoTokenizer.from_pretrained(cached_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(LLAVA_IMAGE_CONFIG))
    (out / "processor_config.json").write_text(json.dumps(LLAVA_PROCESSOR_CONFIG))
    (out / "chat_template.jinja").write_text(LLAVA_TEMPLATE)
    return out


def llava_reference_processor(path):
    """transformers' own LlavaProcessor from the same parts."""
    from transformers import AutoTokenizer, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    cfg = {k: v for k, v in LLAVA_IMAGE_CONFIG.items() if k != "image_processor_type"}
    return LlavaProcessor(image_processor=CLIPImageProcessorPil(**cfg), tokenizer=AutoTokenizer.from_pretrained(path),
                          patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=LLAVA_TEMPLATE)


def tiny_llava(tokenizer, *, seed: int = 0):
    """A random LLaVA (CLIP vision tower, Qwen2 language model: 1-D RoPE), fp32, eval mode."""
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    cfg = LlavaConfig(
        vision_config={"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56, "patch_size": 14},
        text_config={"model_type": "qwen2", "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "max_position_embeddings": 4096},
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(cfg).float().eval()


# Qwen3-VL's image processor: patches of 16, the same family's resize rule.
QWEN3_IMAGE_CONFIG = dict(IMAGE_CONFIG, patch_size=16, min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 64)


def reference_processor(path, *, qwen3: bool = False):
    """transformers' own Qwen2VLProcessor (Qwen3VLProcessor) from the same parts, built from arguments (no video
    processor: torchvision is missing)."""
    from transformers import AutoTokenizer, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class Processor(Qwen3VLProcessor if qwen3 else Qwen2VLProcessor):
        def check_argument_for_proper_class(self, name, arg):
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    cfg = QWEN3_IMAGE_CONFIG if qwen3 else IMAGE_CONFIG
    ip = Qwen2VLImageProcessorPil(**{k: v for k, v in cfg.items() if k != "image_processor_type"})
    return Processor(image_processor=ip, tokenizer=AutoTokenizer.from_pretrained(path),
                     chat_template=(pathlib.Path(path) / "chat_template.jinja").read_text())


def make_image(path, size, seed: int):
    """A PNG of random pixels of ``size`` (width, height)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def make_rows(root, n: int, *, seed: int = 0, max_images: int = 3) -> list[dict]:
    """``n`` rows in TRL's form (``{"type": "image"}`` parts + an ``images`` column of relative paths).

    Rows have 0 to ``max_images`` images (several in one message, some in a later turn), one or two turns.
    """
    root = pathlib.Path(root)
    (root / "img").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = "the a cat dog red blue sky tree what is this picture shows two of and in on near".split()

    def say(k):
        return " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."

    rows = []
    for r in range(n):
        images = []
        messages = []
        for turn in range(rng.choice([1, 1, 2])):
            parts = []
            for _ in range(rng.randint(0, max_images) if turn == 0 or rng.random() < 0.3 else 0):
                name = f"img/{r}_{len(images)}.png"
                make_image(root / name, rng.choice(SIZES), seed * 100003 + r * 10 + len(images))
                images.append(name)
                parts.append({"type": "image"})
            parts.insert(rng.randint(0, len(parts)), {"type": "text", "text": say(rng.randint(2, 9))})
            messages.append({"role": "user", "content": parts})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": say(rng.randint(1, 12))}]})
        rows.append({"messages": messages, "images": images})
    return rows


def write_jsonl(path, rows) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def with_pil(row: dict, root) -> list[dict]:
    """A row's messages with its images as PIL images inside the parts (what the processor's template takes)."""
    from PIL import Image

    images = iter(row["images"])
    out = []
    for m in row["messages"]:
        parts = []
        for p in m["content"]:
            if p["type"] == "image":
                parts.append({"type": "image", "image": Image.open(pathlib.Path(root) / next(images)).convert("RGB")})
            else:
                parts.append(p)
        out.append({"role": m["role"], "content": parts})
    return out


def tiny_model(kind: str, tokenizer, *, seed: int = 0):
    """A random Qwen2-VL (``"qwen2-vl"``), Qwen2.5-VL (``"qwen2.5-vl"``) or Qwen3-VL (``"qwen3-vl"``) model, fp32,
    eval mode."""
    import torch

    ids = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
    text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    tokens = dict(image_token_id=ids[0], video_token_id=ids[1], vision_start_token_id=ids[2],
                  vision_end_token_id=ids[3])
    torch.manual_seed(seed)
    if kind == "qwen3-vl":  # patch 16 (its processor's), interleaved mRoPE, deepstack features
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text = dict(text, head_dim=16, rope_parameters=dict(text["rope_parameters"], mrope_interleaved=True))
        cfg = Qwen3VLConfig(text_config=text, vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
            num_position_embeddings=64, deepstack_visual_indexes=[1]), **tokens)
        model = Qwen3VLForConditionalGeneration(cfg)
    elif kind == "qwen2-vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

        cfg = Qwen2VLConfig(text_config=text, vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2,
                                                                  mlp_ratio=2), **tokens)
        model = Qwen2VLForConditionalGeneration(cfg)
    else:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32, window_size=56,
            fullatt_block_indexes=[1]), **tokens)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    return model.float().eval()


# Gemma 3: every image 56 x 56 (SigLIP, 4 x 4 patches of 14 pooled to 2 x 2: 4 soft tokens an image), the
# template's <start_of_image> expanded by the processor, bidirectional attention inside each image.
GEMMA3_TEMPLATE = QWEN2_VL_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<start_of_image>")
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}


def make_gemma3_dir(out) -> pathlib.Path:
    """A Gemma 3 processor directory: the Qwen2.5 tokenizer plus Gemma 3's image tokens, Gemma 3's preprocessing
    (56 x 56), ``processor_config.json``'s ``image_seq_length``."""
    from transformers import AutoTokenizer

    out = pathlib.Path(out)
    AutoTokenizer.from_pretrained(cached_tokenizer_dir(), extra_special_tokens=GEMMA3_TOKENS).save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 56, "width": 56}}))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor",
                                                           "image_seq_length": 4}))
    (out / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)
    return out


def gemma3_reference_processor(tokenizer):
    """transformers' own Gemma3Processor from the same parts (the directory's tokenizer, loaded)."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    return Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 56, "width": 56}),
                           tokenizer=tokenizer, chat_template=GEMMA3_TEMPLATE,
                           image_seq_length=4)


def tiny_gemma3(tokenizer, *, sliding_window: int = 24, seed: int = 0):
    """A random Gemma 3 (SigLIP tower, a sliding and a full attention layer), fp32, eval mode."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = Gemma3Config(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                     "sliding_window": sliding_window, "layer_types": ["sliding_attention", "full_attention"],
                     "max_position_embeddings": 4096},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 56, "patch_size": 14},
        mm_tokens_per_image=4, boi_token_id=tokenizer.boi_token_id, eoi_token_id=tokenizer.eoi_token_id,
        image_token_id=tokenizer.image_token_id)
    torch.manual_seed(seed)
    return Gemma3ForConditionalGeneration(cfg).float().eval()
