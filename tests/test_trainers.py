"""Real training runs on vecpack packs: transformers.Trainer, TRL SFTTrainer and a plain loop.

Tiny random Qwen2 and Llama models (transformers, CPU, fp32; the examples'
8k-token tokenizer, so the vocabulary matches real chat data) train 3 steps on
packs of short ShareGPT conversations built by ``vecpack.build`` with
``masking="assistant"``. A forward hook on the backbone runs every document of
every packed forward alone and compares its logits with those inside the pack
(atol 1e-5). Also checked: finite losses, the labels each step trained (only
assistant turns, vecpack's), ``num_items_in_batch``, the first step's loss
against the documents' solo losses, and a control (the plain loop on
``collate_flash`` batches as they were before they carried
``use_cache=False``) that fails the same check.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

import vecpack  # noqa: E402
from vecpack.integrations.export import export  # noqa: E402

TOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tokenizer"
MAX_LEN = 192
ATOL = 1e-5
WORDS = ("the model packs short chat rows into long sequences and every document keeps its own attention "
         "while the trainer counts only the answers of the assistant in the loss").split()
KINDS = [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa"), ("llama", "eager")]

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    yield
    torch.set_num_threads(threads)


def _write_rows(path: pathlib.Path, n: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)

    def msg():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14)))

    convs = []
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            conv = [{"from": "system", "value": msg()}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 2)):
                conv += [{"from": "human", "value": msg()}, {"from": "gpt", "value": msg()}]
            f.write(json.dumps({"conversations": conv}) + "\n")
            convs.append(conv)
    return convs


_DATA: dict = {}


def trainer_data(tmp_path_factory) -> dict:
    """Chat rows -> vecpack.build packs, the same saved + loaded, and exported for TRL (built once a session)."""
    if not _DATA:
        root = tmp_path_factory.mktemp("trainers")
        convs = _write_rows(root / "chat.jsonl", 60, seed=0)
        packed = vecpack.build(root / "chat.jsonl", str(TOK_DIR), max_len=MAX_LEN, cache=False, n_jobs=1,
                               progress=False)
        assert packed.stats["truncated"] == packed.stats["dropped"] == 0
        vecpack.save(packed, root / "saved")
        export(packed, root / "hf", "hf")
        tok = transformers.AutoTokenizer.from_pretrained(str(TOK_DIR))
        _DATA.update(root=root, convs=convs, packed=packed, loaded=vecpack.load(root / "saved"),
                     hf_dir=root / "hf", tok=tok)
    return _DATA


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return trainer_data(tmp_path_factory)


def _model(kind: str, attn: str, vocab: int):
    cfg = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1, tie_word_embeddings=False)
    config, cls = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                   "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[kind]
    torch.manual_seed(0)
    model = cls._from_config(config(**cfg), attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero; make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    return model


def _batches(packed, bs: int, steps: int) -> list[list[int]]:
    """The pack indices of each batch under the sequential sampler."""
    return [list(range(s * bs, (s + 1) * bs)) for s in range(steps)]


def _segments(packed, packs: list[int]) -> list[int]:
    return [int(n) for i in packs for n in packed[i]["seq_lens"]]


class SoloCheck:
    """Forward hook on the backbone: each document inside a packed forward vs the document run alone.

    ``rows`` gives, forward after forward, the document lengths of each batch row (taken from
    the packs, not from the batch). The logits compared are ``lm_head`` of the hidden states,
    so the check also works under TRL's fused LM head, which returns no logits.
    """

    def __init__(self, model, rows):
        self.model, self.rows, self.errors, self.calls = model, iter(rows), [], 0
        self._busy = False
        self.handle = model.model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        if self._busy:
            return
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        head = self.model.lm_head
        self._busy, self.calls = True, self.calls + 1
        try:
            with torch.no_grad():
                hidden = output.last_hidden_state
                for r, lens in enumerate(next(self.rows)):
                    a = 0
                    for n in lens:
                        solo = module(input_ids=ids[r:r + 1, a:a + n]).last_hidden_state[0]
                        self.errors.append((head(hidden[r, a:a + n]) - head(solo)).abs().max().item())
                        a += n
                    assert ids.shape[1] >= a
        finally:
            self._busy = False

    def close(self):
        self.handle.remove()
        return self


def _reference_loss(model0, packed, packs: list[int]) -> tuple[float, int]:
    """Token-mean cross-entropy of these packs' documents, each run alone (assistant targets only)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in packs:
            p = packed[i]
            a = 0
            for n in p["seq_lens"].tolist():
                ids = torch.from_numpy(p["input_ids"][a:a + n].astype(np.int64))[None]
                lab = torch.from_numpy(p["labels"][a:a + n].astype(np.int64))[None]
                logits = model0(input_ids=ids).logits[0, :-1]
                tgt = lab[0, 1:]
                keep = tgt != -100
                total += float(torch.nn.functional.cross_entropy(logits[keep], tgt[keep], reduction="sum"))
                count += int(keep.sum())
                a += n
    return total / count, count


class Recorder:
    """Trainer mixin: the labels and ``num_items_in_batch`` of every compute_loss call."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.__dict__.setdefault("seen", []).append(
            (inputs["labels"].detach().clone(), None if num_items_in_batch is None else int(num_items_in_batch)))
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


RecTrainer = type("RecTrainer", (Recorder, transformers.Trainer), {})
RecSFTTrainer = type("RecSFTTrainer", (Recorder, trl.SFTTrainer), {})


def _args(tmp_path, sft: bool, **kw):
    base = dict(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3,
                logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                seed=0, disable_tqdm=True, train_sampling_strategy="sequential")
    if sft:
        base.update(bf16=False, gradient_checkpointing=False, padding_free=True, max_length=None,
                    dataset_kwargs={"skip_prepare_dataset": True})
    base.update(kw)
    return trl.SFTConfig(**base) if sft else transformers.TrainingArguments(**base)


def _expected_labels(packed, packs: list[int]) -> list[int]:
    out = []
    for i in packs:
        p = packed[i]
        out += p["labels"][: int(p["seq_lens"].sum())].tolist()
    return out


def _check_run(trainer, hook, packed, model0, bs=2, steps=3):
    """What every real run must show."""
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses), losses
    hook.close()
    batches = _batches(packed, bs, steps)
    assert hook.calls == steps
    assert len(hook.errors) == sum(len(_segments(packed, b)) for b in batches)
    assert max(hook.errors) <= ATOL, f"a document's packed logits differ from its solo run by {max(hook.errors):.2e}"
    for (labels, n_items), b in zip(trainer.seen, batches):
        assert labels.shape[0] == 1 and labels[0].tolist() == _expected_labels(packed, b)  # vecpack's, as they are
        assert n_items == int((labels[:, 1:] != -100).sum())
    ref, n = _reference_loss(model0, packed, batches[0])
    assert trainer.seen[0][1] == n
    assert abs(losses[0] - ref) <= 1e-5 * ref, (losses[0], ref)
    return losses


def test_labels_train_only_assistant_turns(data):
    """The packs' labels: each document trains exactly its assistant contents and their end token."""
    tok, packed = data["tok"], data["packed"]
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    end = tok.convert_tokens_to_ids("<|im_end|>")
    plan = packed.plan
    checked = 0
    for p in range(len(packed)):
        row = packed[p]
        a = 0
        for k, n in enumerate(row["seq_lens"].tolist()):
            conv = data["convs"][int(plan.doc_index[plan.pack_offsets[p] + k])]
            msgs = [{"role": roles[m["from"]], "content": m["value"]} for m in conv]
            ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
            assert row["input_ids"][a:a + n].tolist() == list(ids)
            want = np.zeros(n, bool)
            for t, m in enumerate(msgs):
                if m["role"] == "assistant":  # the turn's tokens after "<|im_start|>assistant\n", up to <|im_end|>
                    lo = len(tok.apply_chat_template(msgs[:t], add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
                    hi = len(tok.apply_chat_template(msgs[:t + 1], tokenize=True, return_dict=False)) - 1
                    assert ids[hi - 1] == end
                    want[lo:hi] = True
            want[0] = False
            assert np.array_equal(row["labels"][a:a + n] != -100, want)
            assert np.array_equal(row["labels"][a:a + n][want], row["input_ids"][a:a + n][want])
            a += n
            checked += 1
    assert checked == packed.stats["num_documents"]


@pytest.mark.parametrize("kind,attn", KINDS)
def test_stock_trainer(data, tmp_path, kind, attn):
    """transformers.Trainer(train_dataset=packed, data_collator=collate_flash), 3 steps."""
    packed = data["packed"]
    model = _model(kind, attn, len(data["tok"]))
    model0 = copy.deepcopy(model).eval()
    hook = SoloCheck(model, [[_segments(packed, b)] for b in _batches(packed, 2, 3)])
    trainer = RecTrainer(model=model, args=_args(tmp_path, False, remove_unused_columns=False),
                         train_dataset=packed, data_collator=vecpack.collate_flash)
    if attn == "sdpa":  # the check changes nothing: sdpa (checked) and eager (not) log the same losses
        assert vecpack.check_trainer(trainer)["documents"] == len(_segments(packed, [0, 1]))
    trainer.train()
    data.setdefault(("trainer", kind), []).append(_check_run(trainer, hook, packed, model0))
    if len(data[("trainer", kind)]) == 2:
        np.testing.assert_allclose(*data[("trainer", kind)], rtol=1e-5)


@pytest.mark.parametrize("kind,attn,source", [("qwen2", "sdpa", "packed"), ("qwen2", "eager", "export"),
                                              ("llama", "sdpa", "export"), ("llama", "eager", "loaded")])
def test_stock_sft_trainer(data, tmp_path, kind, attn, source):
    """trl.SFTTrainer, 3 steps: vecpack.hf_dataset(packed or vecpack.load(...)), or the exported dataset."""
    packed, tok = data["packed"], data["tok"]
    if source == "export":
        train, args = datasets.load_from_disk(str(data["hf_dir"])), _args(tmp_path, True)
    else:
        train = vecpack.hf_dataset(data[source])
        args = _args(tmp_path, True, remove_unused_columns=False)
    model = _model(kind, attn, len(tok))
    model0 = copy.deepcopy(model).eval()
    hook = SoloCheck(model, [[_segments(packed, b)] for b in _batches(packed, 2, 3)])
    trainer = RecSFTTrainer(model=model, args=args, train_dataset=train, processing_class=tok)
    assert trainer.train_dataset is train  # TRL prepared nothing: no re-tokenizing, no re-packing
    if attn == "sdpa":
        assert vecpack.check_trainer(trainer)["layout"] == "flat"
    trainer.train()
    _check_run(trainer, hook, packed, model0)


@pytest.mark.parametrize("kind,attn", KINDS)
def test_plain_loop(data, kind, attn):
    """A hand-written loop: model(**batch) in train mode, AdamW, 3 steps; and the control."""
    packed = data["packed"]
    model = _model(kind, attn, len(data["tok"])).train()
    loader = torch.utils.data.DataLoader(packed, batch_size=2, collate_fn=vecpack.collate_flash)
    hook = SoloCheck(model, [[_segments(packed, b)] for b in _batches(packed, 2, 3)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _, batch in zip(range(3), loader):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert max(hook.close().errors) <= ATOL

    # control: the same loop on the batches collate_flash made before (no use_cache=False, no seq_idx)
    model = _model(kind, attn, len(data["tok"])).train()
    assert model.config.use_cache  # the default: no Trainer has switched it off on this model
    hook = SoloCheck(model, [[_segments(packed, b)] for b in _batches(packed, 2, 1)])
    old = {k: v for k, v in next(iter(loader)).items() if k not in ("use_cache", "seq_idx")}
    model(**old).loss.backward()
    assert max(hook.close().errors) > 1e3 * ATOL, "the control did not leak: the check has no teeth"


# --------------------------------------------------------------------------- gradient accumulation


def _one_step(data, tmp_path, bs: int, ga: int, sft: bool, cls=None):
    """One SGD step (lr 1, no clipping) on the first 4 packs; the parameter update and the logged loss."""
    tok, packed = data["tok"], data["packed"]
    model = _model("qwen2", "sdpa", len(tok))
    before = [p.detach().clone() for p in model.parameters()]
    kw = dict(max_steps=1, per_device_train_batch_size=bs, gradient_accumulation_steps=ga, optim="sgd",
              learning_rate=1.0, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
              remove_unused_columns=False)
    if sft:
        cls = cls or trl.SFTTrainer
        trainer = cls(model=model, args=_args(tmp_path, True, **kw), train_dataset=vecpack.hf_dataset(packed),
                      processing_class=tok)
    else:
        cls = cls or transformers.Trainer
        trainer = cls(model=model, args=_args(tmp_path, False, **kw), train_dataset=packed,
                      data_collator=vecpack.collate_flash)
    trainer.train()
    delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before)])
    return delta, [h["loss"] for h in trainer.state.log_history if "loss" in h][0]


def _same(a, b):
    return (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()


@pytest.mark.parametrize("sft", [False, True], ids=["trainer", "sft"])
def test_gradient_accumulation_is_token_exact(data, tmp_path, sft):
    """2 accumulated micro-batches of 2 packs == one batch of the 4 packs: same loss, same update."""
    packed = data["packed"]
    counts = [sum(int((packed[i]["labels"][1:] != -100).sum()) for i in b) for b in ([0, 1], [2, 3])]
    assert counts[0] != counts[1]  # so a per-micro-batch mean would not give the same loss
    d1, l1 = _one_step(data, tmp_path / "a", 4, 1, sft)
    d2, l2 = _one_step(data, tmp_path / "b", 2, 2, sft)
    assert _same(d2, d1) and abs(l1 - l2) <= 1e-5 * l1, ((d2 - d1).abs().max().item(), l1, l2)
    ref, _ = _reference_loss(_model("qwen2", "sdpa", len(data["tok"])).eval(), packed, [0, 1, 2, 3])
    assert abs(l1 - ref) <= 1e-5 * ref


# --------------------------------------------------------------------------- per-document loss


def _per_document_reference(data):
    """The mean over the first 4 packs' documents of each document's mean loss, run alone: value and -grad."""
    packed = data["packed"]
    model = _model("qwen2", "sdpa", len(data["tok"])).train()
    means = []
    for i in range(4):
        p = packed[i]
        a = 0
        for n in p["seq_lens"].tolist():
            ids = torch.from_numpy(p["input_ids"][a:a + n].astype(np.int64))[None]
            lab = torch.from_numpy(p["labels"][a:a + n].astype(np.int64))[None]
            if (lab[0, 1:] != -100).any():
                means.append(model(input_ids=ids, labels=lab).loss)
            a += n
    loss = torch.stack(means).mean()
    loss.backward()
    return loss.item(), -torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("sft", [False, True], ids=["trainer", "sft"])
def test_document_mean_loss_equals_the_unpacked_per_sequence_mean(data, tmp_path, sft):
    ref_loss, ref_update = _per_document_reference(data)
    base = trl.SFTTrainer if sft else transformers.Trainer
    cls = type("DocMean", (vecpack.DocumentMeanLoss, base), {})
    delta, loss = _one_step(data, tmp_path / "doc", 2, 2, sft, cls=cls)  # accumulated: exact over the step
    assert _same(delta, ref_update) and abs(loss - ref_loss) <= 1e-5 * ref_loss, (loss, ref_loss)
    token_mean, _ = _reference_loss(_model("qwen2", "sdpa", len(data["tok"])).eval(), data["packed"], [0, 1, 2, 3])
    assert abs(token_mean - ref_loss) > 1e-3  # the default loss is another average on these documents


def test_document_mean_loss_in_a_plain_loop(data):
    from vecpack.integrations.loss import document_mean_loss, document_weights

    packed = data["packed"]
    ref_loss, ref_update = _per_document_reference(data)
    model = _model("qwen2", "sdpa", len(data["tok"])).train()
    micro = [vecpack.collate_flash([packed[i] for i in b]) for b in ([0, 1], [2, 3])]
    docs = sum(document_weights(b["labels"], b["position_ids"])[1] for b in micro)
    total = 0.0
    for b in micro:
        loss = document_mean_loss(model(**{k: v for k, v in b.items() if k != "labels"}).logits, b["labels"],
                                  b["position_ids"], num_documents=docs)
        loss.backward()
        total += loss.item()
    update = -torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert _same(update, ref_update) and abs(total - ref_loss) <= 1e-5 * ref_loss


def test_plain_loop_gradient_accumulation(data):
    """model(**micro_batch, num_items_in_batch=<targets of the step>) accumulates to the one-batch gradient."""
    packed = data["packed"]
    model = _model("qwen2", "sdpa", len(data["tok"])).train()
    full = vecpack.collate_flash([packed[i] for i in range(4)])
    model(**full).loss.backward()
    want = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad()
    micro = [vecpack.collate_flash([packed[i] for i in b]) for b in ([0, 1], [2, 3])]
    n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro)
    for b in micro:
        model(**b, num_items_in_batch=n).loss.backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert _same(got, want)


def test_sft_trainer_on_packed_tool_rows(tmp_path):
    """trl.SFTTrainer, 3 steps, on packs of tool-calling rows (calls, results, reasoning, tool schemas) built
    with TRL's Qwen2.5 template: every document's logits inside a pack equal its solo run."""
    import shutil

    from tests.agentic_data import agentic_rows, trl_templates, write_jsonl

    tok_dir = tmp_path / "tok"
    shutil.copytree(TOK_DIR, tok_dir)
    (tok_dir / "chat_template.jinja").write_text((trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8"),
                                                 encoding="utf-8")
    rows = agentic_rows(16, seed=7)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    packed = vecpack.build(path, str(tok_dir), style="openai", max_len=1024, cache=False, n_jobs=1, progress=False,
                           long="drop")
    assert len(packed) >= 6 and packed.stats["num_documents"] - packed.stats["dropped"] >= 8
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    model = _model("qwen2", "sdpa", len(tok))
    model0 = copy.deepcopy(model).eval()
    hook = SoloCheck(model, [[_segments(packed, b)] for b in _batches(packed, 2, 3)])
    trainer = RecSFTTrainer(model=model, args=_args(tmp_path / "out", True, remove_unused_columns=False),
                            train_dataset=vecpack.hf_dataset(packed), processing_class=tok)
    vecpack.check_trainer(trainer)
    trainer.train()
    _check_run(trainer, hook, packed, model0)
