"""Chat templates: exact rendering, compiled layouts, masks, the Jinja fallback."""

import json
import pickle

import pytest
from helpers import QWEN3_LIKE

from vecpack.chat.formats import to_messages
from vecpack.chat.template import ChatTemplate
from vecpack.errors import InputError
from vecpack.testing import LLAMA3_CHAT_TEMPLATE, QWEN_CHAT_TEMPLATE, make_sharegpt

QWEN_VARS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_VARS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
LLAMA_ADDED = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eot_id|>", "<|eom_id|>"]

HAND = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "  \n\t "}, {"role": "assistant", "content": "\n\nleading newlines"}],
    [{"role": "user", "content": "emoji 🤖 <|im_end|> <|eot_id|> ação"}, {"role": "assistant", "content": " x "}],
    [{"role": "assistant", "content": "first"}, {"role": "assistant", "content": "second"}],
    [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "only a question"}],
]


def qwen(masking="assistant", **kw):
    return ChatTemplate(QWEN_CHAT_TEMPLATE, variables=QWEN_VARS, added_tokens=QWEN_ADDED, masking=masking, **kw)


def llama(masking="assistant", **kw):
    return ChatTemplate(LLAMA3_CHAT_TEMPLATE, variables=LLAMA_VARS, added_tokens=LLAMA_ADDED, masking=masking,
                        **kw)


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "rows.jsonl"
    make_sharegpt(path, 200, seed=7)
    return [to_messages(json.loads(line), "sharegpt") for line in open(path, encoding="utf-8")] + HAND


@pytest.mark.parametrize("fixture, make", [("qwen_dir", qwen), ("llama3_dir", llama)])
def test_render_equals_transformers(request, conversations, fixture, make):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(request.getfixturevalue(fixture))
    for mode in ("compiled", "jinja"):
        t = make(mode=mode)
        for msgs in conversations:
            want = hf.apply_chat_template(msgs, tokenize=False)
            assert t.render(msgs) == want
            segs = t.segments(msgs)
            assert "".join(s for s, _ in segs) == want, msgs


def test_qwen_segments_and_masks():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "A2"}]
    expect = [("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", False),
              ("A1", True), ("<|im_end|>", True),
              ("\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n", False),
              ("A2", True), ("<|im_end|>", True), ("\n", False)]

    def merged(segs):
        out = []
        for s, t in segs:
            if out and out[-1][1] == t and not t:
                out[-1] = (out[-1][0] + s, t)
            else:
                out.append((s, t))
        return out

    for mode in ("compiled", "jinja"):
        assert merged(qwen(mode=mode).segments(msgs)) == expect
        last = merged(qwen("last", mode=mode).segments(msgs))
        assert [s for s, t in last if t] == ["A2", "<|im_end|>"]
        everything = qwen("all", mode=mode).segments(msgs)
        assert all(t for s, t in everything)


def test_default_system_prompt_is_a_literal():
    segs = qwen().segments([{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}])
    text = "".join(s for s, _ in segs)
    assert text.startswith("<|im_start|>system\nYou are Qwen")
    assert [s for s, t in segs if t] == ["A", "<|im_end|>"]


def test_llama3_trim_is_detected():
    t = llama()
    msgs = [{"role": "user", "content": "  hi \n"}, {"role": "assistant", "content": "\n\n  answer \t"}]
    segs = t.segments(msgs)
    assert "".join(s for s, _ in segs) == t.render(msgs)
    assert [s for s, tr in segs if tr] == ["answer", "<|eot_id|>"]
    assert t._layouts[("user", "assistant")].slots[0][2] is str.strip


def test_template_errors_become_input_errors():
    source = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
              "{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    t = ChatTemplate(source)
    with pytest.raises(InputError, match="roles must alternate"):
        t.segments([{"role": "assistant", "content": "x"}])
    assert t.segments([{"role": "user", "content": "x"}]) == [("[user]", False), ("x", False)]


def test_contents_the_template_tests_for_go_through_jinja():
    # renders differently when the content mentions "secret": rows that do are rendered by Jinja
    source = ("{% for m in messages %}{% if 'secret' in m.content %}[hidden]{% else %}<{{ m.role }}>"
              "{{ m.content }}</s>{% endif %}{% endfor %}")
    rows = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            [{"role": "user", "content": "a secret"}, {"role": "assistant", "content": "b"}]]
    t = ChatTemplate(source, added_tokens=["</s>"], variables={"eos_token": "</s>"})
    assert t._inside == ("secret",)
    for msgs in rows:
        segs = t.segments(msgs)
        assert "".join(s for s, _ in segs) == t.render(msgs)
        assert [s for s, tr in segs if tr] == ["b", "</s>"]
    assert t.verify(rows) == 0 and t.mode == "compiled"




def test_reasoning_template_rewrites_contents_exactly():
    t = ChatTemplate(QWEN3_LIKE, added_tokens=QWEN_ADDED, variables=QWEN_VARS)
    assert "</think>" in t._inside and "\n" in t._edges
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe answer."},
            {"role": "user", "content": "more\n"}, {"role": "assistant", "content": "plain"}]
    segs = t.segments(msgs)
    assert "".join(s for s, _ in segs) == t.render(msgs)
    assert [s for s, tr in segs if tr] == ["The answer.", "<|im_end|>", "plain", "<|im_end|>"]


def test_length_dependent_template_falls_back_to_jinja():
    # no string to look for: only checking real rows reveals it
    source = ("{% for m in messages %}{% if m.content | length > 20 %}[long]{% endif %}<{{ m.role }}>"
              "{{ m.content }}</s>{% endfor %}")
    rows = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            [{"role": "user", "content": "a long one, longer than twenty"}, {"role": "assistant", "content": "b"}]]
    t = ChatTemplate(source, added_tokens=["</s>"], variables={"eos_token": "</s>"})
    assert t.mode == "compiled"
    assert "".join(s for s, _ in t.segments(rows[1])) != t.render(rows[1])  # wrong before verification
    assert t.verify(rows) == 1 and t.mode == "jinja"
    for msgs in rows:
        segs = t.segments(msgs)
        assert "".join(s for s, _ in segs) == t.render(msgs)
        assert [s for s, tr in segs if tr] == ["b", "</s>"]


def test_templates_that_skip_empty_contents():
    source = "{% for m in messages %}{% if m.content %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}"
    t = ChatTemplate(source)
    msgs = [{"role": "user", "content": ""}, {"role": "assistant", "content": "b"}]
    assert t.segments(msgs) == [("<assistant>", False), ("b", True)]
    # the layout is kept for rows without empty contents; rows with one are rendered by Jinja
    assert t._layouts[("user", "assistant")] is not None and "" in t._equal
    full = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert not t._tripped(full) and t.segments(full) == [("<user>", False), ("a", False), ("<assistant>", False),
                                                         ("b", True)]


def test_generation_tag_and_tojson():
    source = ("{% for m in messages %}{{ m.role | tojson }}:{% if m.role == 'assistant' %}{% generation %}"
              "{{ m.content }}<|end|>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}")
    t = ChatTemplate(source, added_tokens=["<|end|>"])
    msgs = [{"role": "user", "content": "é"}, {"role": "assistant", "content": "ok"}]
    assert t.render(msgs) == '"user":é\n"assistant":ok<|end|>\n'
    assert [s for s, tr in t.segments(msgs) if tr] == ["ok", "<|end|>"]


def test_unrendered_roles_and_pickling():
    t = qwen()
    msgs = [{"role": "user", "content": "U"}, {"role": "tool", "content": "T"},
            {"role": "assistant", "content": "A"}]
    assert "T" not in t.render(msgs)
    assert "".join(s for s, _ in t.segments(msgs)) == t.render(msgs)
    t.mode = "jinja"
    clone = pickle.loads(pickle.dumps(t))
    assert clone.mode == "jinja" and clone.segments(msgs) == t.segments(msgs)
    assert len(pickle.dumps(t)) < 10_000


def test_bad_arguments():
    with pytest.raises(ValueError, match="masking"):
        ChatTemplate("x", masking="user")
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplate(None)


def _trl_templates():
    try:
        import trl
    except Exception:  # pragma: no cover - optional dependency
        return []
    import pathlib

    return sorted((pathlib.Path(trl.__file__).parent / "chat_templates").glob("*.jinja"))


REASONING = [
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nstep\n</think>\n\nAnswer."},
     {"role": "user", "content": "again\n"}, {"role": "assistant", "content": "<think>x</think>ok"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def qwen_hf(qwen_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(qwen_dir)


@pytest.mark.parametrize("path", _trl_templates(), ids=lambda p: p.stem)
def test_real_templates_shipped_with_trl(path, conversations, qwen_hf):
    """Every chat template TRL ships (Qwen 2.5/3, Llama 3.x, Gemma, Phi, DeepSeek, gpt-oss...) renders exactly."""
    import warnings

    source = path.read_text(encoding="utf-8")
    t = ChatTemplate(source, variables={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                     added_tokens=QWEN_ADDED)
    sample = conversations[:24] + HAND + REASONING
    t.verify(sample[:8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for msgs in sample:
            try:
                want = qwen_hf.apply_chat_template(msgs, tokenize=False, chat_template=source)
            except Exception:
                with pytest.raises(Exception):  # noqa: B017 - whatever Jinja raises
                    t.segments(msgs)
                continue
            segs = t.segments(msgs)
            assert "".join(s for s, _ in segs) == want, msgs
            trained = "".join(s for s, tr in segs if tr)
            if t.has_generation:  # trained where the {% generation %} blocks are (test_agentic: equal to HF's mask)
                continue
            for m in msgs:
                if m["role"] == "assistant" and "think>" not in m["content"] and m["content"].strip() in want:
                    assert m["content"].strip() in trained
