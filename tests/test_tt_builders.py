"""vecpack.torchtune's builders vs torchtune 0.6.1's: the same packs, pack for pack (first-label rule aside)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

pytest.importorskip("torchtune")
pytestmark = pytest.mark.torchtune

import torch  # noqa: E402
import torchtune.datasets as ttd  # noqa: E402
from torchtune.datasets import PackedDataset as TorchtunePacked  # noqa: E402
from torchtune_helpers import WordTokenizer  # noqa: E402

import vecpack  # noqa: E402
import vecpack.torchtune as vt  # noqa: E402
from vecpack.errors import InputError  # noqa: E402
from vecpack.testing import make_rows, make_sharegpt  # noqa: E402

MSL = 160

# builder -> (rows written by make_rows / make_sharegpt, builder options, torchtune's unpacked dataset's name
# and load_dataset keywords for the two builders torchtune 0.6.1 cannot run on local files)
BUILDERS = {
    "instruct_dataset": ("input_output", {"q": "input"}, dict(column_map={"input": "q", "output": "output"},
                                                           new_system_prompt="Be brief.", train_on_input=True)),
    "alpaca_dataset": ("alpaca", None, {}),
    "alpaca_cleaned_dataset": ("alpaca", None, dict(train_on_input=False)),
    "slimorca_dataset": ("sharegpt", None, dict(new_system_prompt="Você é um assistente.")),
    "samsum_dataset": ("input_output", {"dialogue": "input", "summary": "output"}, {}),
    "grammar_dataset": ("input_output", None, {}),
    "text_completion_dataset": ("text", None, {}),
    "cnn_dailymail_articles_dataset": ("text", {"article": "text"}, {}),
    "wikitext_dataset": ("text", {"page": "text"}, {}),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("builders")
    out = {}
    for name, (style, renamed, _) in BUILDERS.items():
        path = d / f"{name}.jsonl"
        if style == "sharegpt":
            make_sharegpt(path, 40, seed=3, median_user=60, median_assistant=150)
        else:
            columns = {v: k for k, v in (renamed or {}).items()}
            make_rows(path, 40, style=style, seed=len(name), median=150, columns=columns)
        out[name] = str(path)
    return out


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    return qwen2_5_tokenizer(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"), max_seq_len=MSL)


class FirstLabelIgnored:
    """torchtune's items with the first label -100: what vecpack's builders pack (PackedChatDataset's rule)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        item = dict(self.ds[i])
        item["labels"] = [-100] + list(item["labels"])[1:] if len(item["labels"]) else []
        return item


def _torchtune_unpacked(name, tok, path, options):
    if name in ("cnn_dailymail_articles_dataset", "wikitext_dataset"):  # what they would build, unbroken
        column = "article" if name.startswith("cnn") else "page"
        return ttd.TextCompletionDataset(tok, source="json", column=column, data_files=path, split="train")
    return getattr(ttd, name)(tok, source="json", data_files=path, **options)


def _torchtune_packs(ds, split):
    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
        return TorchtunePacked(FirstLabelIgnored(ds), max_seq_len=MSL, split_across_pack=split)


def _assert_same(ours, theirs):
    assert isinstance(ours, TorchtunePacked) and len(ours) == len(theirs) > 1
    for i in range(len(theirs)):
        for k, v in theirs[i].items():
            assert ours[i][k].dtype == torch.long and torch.equal(ours[i][k], v), (i, k)


@pytest.mark.parametrize("tokenizer", ["qwen2.5", "words"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_packs_equal_torchtune(name, tokenizer, data, request, cache_dir):
    tok = request.getfixturevalue("qwen") if tokenizer == "qwen2.5" else WordTokenizer(max_seq_len=MSL)
    options = BUILDERS[name][2]
    theirs_ds = _torchtune_unpacked(name, tok, data[name], options)
    for split in (False, True):
        ours = getattr(vt, name)(tok, source="json", data_files=data[name], packed=True, split_across_pack=split,
                                 progress=False, **options)
        assert ours.stats["backend"] == ("tiktoken" if tokenizer == "qwen2.5" else "items")
        assert ours.split_across_pack is split and ours.max_seq_len == MSL and ours.mask_first_label
        _assert_same(ours, _torchtune_packs(theirs_ds, split))
        if split:
            assert ours.stats["split"] > 0  # documents really were cut across packs


def test_torchtune_own_cnn_and_wikitext_fail_on_local_files(data, qwen):
    """The decision documented in docs/torchtune.md: torchtune 0.6.1 passes max_seq_len to load_dataset."""
    for name in ("cnn_dailymail_articles_dataset", "wikitext_dataset"):
        with pytest.raises(TypeError, match="max_seq_len"):
            getattr(ttd, name)(qwen, source="json", data_files=data[name])
        assert isinstance(getattr(vt, name)(qwen, source="json", data_files=data[name]), ttd.TextCompletionDataset)
    with pytest.raises(ValueError, match="packed datasets only"):
        vt.wikitext_dataset(qwen, source="json", data_files=data["wikitext_dataset"], max_seq_len=64)


def test_cnn_max_seq_len_is_the_pack_length(data, qwen, cache_dir):
    ours = vt.cnn_dailymail_articles_dataset(qwen, source="json", data_files=data["cnn_dailymail_articles_dataset"],
                                             max_seq_len=64, packed=True, progress=False)
    assert ours.max_seq_len == 64 and qwen.max_seq_len == MSL  # the caller's tokenizer is left alone
    short = vt.text_completion_dataset(WordTokenizer(64), source="json", column="article", packed=True,
                                       data_files=data["cnn_dailymail_articles_dataset"], progress=False)
    assert max(int(s.max()) for s in (ours[i]["seq_lens"] for i in range(len(ours)))) <= 64
    assert short.max_seq_len == 64


def test_unpacked_and_missing_max_seq_len(data, qwen):
    path = data["alpaca_dataset"]
    ds = vt.alpaca_dataset(qwen, source="json", data_files=path, n_jobs=2, cache_dir="/nonexistent", progress=False)
    assert type(ds) is ttd.SFTDataset  # torchtune's own; vecpack's keys never reach load_dataset
    assert type(vt.text_completion_dataset(qwen, source="json", data_files=data["text_completion_dataset"])) \
        is ttd.TextCompletionDataset
    with pytest.raises(ValueError, match="PackedDataset requires a max_seq_len to be set on the tokenizer."):
        vt.alpaca_dataset(WordTokenizer(), source="json", data_files=path, packed=True)


def test_vecpack_packed_dataset_over_torchtune_datasets(data, qwen, cache_dir):
    """vecpack.PackedDataset(torchtune dataset): rows it recognises go to the fast engines, exactly torchtune's."""
    for name in ("alpaca_dataset", "text_completion_dataset"):
        ds = getattr(ttd, name)(qwen, source="json", data_files=data[name])
        ours = vecpack.PackedDataset(ds, max_seq_len=MSL, split_across_pack=True, progress=False)
        assert ours.stats["backend"] == "tiktoken" and ours.ds is ds
        with contextlib.redirect_stderr(io.StringIO()):
            theirs = TorchtunePacked(ds, max_seq_len=MSL, split_across_pack=True)
        _assert_same(ours, theirs)
        again = vecpack.PackedDataset(ds, max_seq_len=MSL, split_across_pack=True, progress=False)
        assert again.stats["cache"] == "hit" and len(again) == len(ours)


def test_generic_path_of_a_torchtune_tokenizer_is_cached(tmp_path, cache_dir):
    """Llama 2's tokenizer has no vecpack engine: ds[i] on the workers, keyed by torchtune's own classes."""
    spm = pytest.importorskip("sentencepiece")
    from torchtune.models.llama2 import llama2_tokenizer

    from vecpack.testing import _english_corpus

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_english_corpus()[:60_000].splitlines()),
                                   model_writer=model, vocab_size=300, model_type="bpe", bos_id=1, eos_id=2,
                                   unk_id=0, pad_id=-1, minloglevel=2)
    (tmp_path / "spm.model").write_bytes(model.getvalue())
    tok = llama2_tokenizer(str(tmp_path / "spm.model"), max_seq_len=MSL)
    path = make_rows(tmp_path / "a.jsonl", 30, style="alpaca", median=120)
    first = vt.alpaca_dataset(tok, source="json", data_files=path, packed=True, progress=False)
    second = vt.alpaca_dataset(tok, source="json", data_files=path, packed=True, progress=False)
    assert (first.stats["backend"], first.stats["cache"], second.stats["cache"]) == ("items", "built", "hit")
    _assert_same(second, _torchtune_packs(ttd.alpaca_dataset(tok, source="json", data_files=path), False))
    tok.max_seq_len = MSL // 2  # the key follows the tokenizer's settings
    assert vt.alpaca_dataset(tok, source="json", data_files=path, packed=True, progress=False).stats["cache"] \
        == "built"


def test_bad_rows_located_or_skipped(tmp_path, qwen, cache_dir):
    path = tmp_path / "alpaca.jsonl"
    rows = [{"instruction": f"Say {i}.", "input": "", "output": str(i)} for i in range(20)]
    del rows[13]["output"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=rf"^{path}:14: missing column 'output'"):
        vt.alpaca_dataset(qwen, source="json", data_files=str(path), packed=True, progress=False)
    ds = vt.alpaca_dataset(qwen, source="json", data_files=str(path), packed=True, progress=False, on_error="skip")
    assert ds.stats["rejected"] == 1 and ds.stats["num_documents"] == 19
    with pytest.raises(InputError, match=r"^<SFTDataset> row 13: AssertionError: content must be"):
        vt.alpaca_dataset(WordTokenizer(MSL), source="json", data_files=str(path), packed=True, progress=False)


def test_items_travel_with_torchtune_tokenizers(qwen):
    """torchtune's Qwen tokenizer holds an lru_cache bound to itself: neither pickle nor cloudpickle sends it."""
    import pickle

    from vecpack.inputs.sources import ItemEncoder

    with pytest.raises(pickle.PicklingError, match="lru_cache"):
        pickle.dumps(qwen)
    enc = pickle.loads(pickle.dumps(ItemEncoder([qwen])))
    assert enc.ds[0]._bpe.cache_info().currsize == 0  # a fresh cache, not a copy
    assert enc.ds[0].encode("Hello world") == qwen.encode("Hello world")


def test_yaml_components_resolve():
    from torchtune.config._utils import _get_component_from_path

    for name in BUILDERS:
        assert _get_component_from_path(f"vecpack.torchtune.{name}") is getattr(vt, name)
    assert _get_component_from_path("vecpack.PackedDataset") is vt.PackedDataset is vecpack.PackedDataset
