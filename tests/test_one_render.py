"""Issue 51: each assistant turn found from one marked render (checked against the probe renders on every
chat template TRL ships), transformers' rule for an empty ``{% generation %}`` block (the token over its
place is trained), and the varied tool conversations of ``vecpack.testing.tool_conversations``."""

import json
import random
import re

import numpy as np
import pytest

from tests.agentic_data import MISTRAL_TEKKEN_TEMPLATE, agentic_rows, hf_tools, trl_templates
from vecpack.chat import spans as S
from vecpack.chat.conversation import read_conversation
from vecpack.chat.template import ChatTemplate
from vecpack.errors import InputError
from vecpack.testing import tool_conversations
from vecpack.tokenizing.tokenized import labels_from_parts

pytest.importorskip("trl")


def _sources() -> dict:
    srcs = {p.stem: p.read_text(encoding="utf-8") for p in sorted(trl_templates().glob("*.jinja"))}
    srcs["mistral_tekken"] = MISTRAL_TEKKEN_TEMPLATE
    return srcs


def _specials(srcs) -> list:
    """Every special-looking token the templates write (so that each template finds its end-of-turn tokens)."""
    pattern = r"<[|｜][^<>'\"\s]{1,40}[|｜]>|<(?:end_of_turn|start_of_turn|eos|/s)>|\[/?[A-Z_]+\]"
    return sorted({t for s in srcs.values() for t in re.findall(pattern, s)})


def _rows():
    return agentic_rows(24, seed=3) + tool_conversations(24, seed=1)


def _assistants(conv):
    return [i for i, m in enumerate(conv.messages) if m["role"] == "assistant" and i not in conv.untrained]


def test_marks_equal_probes_on_every_template():
    """On every template TRL ships (and Mistral's) without generation blocks: the one-render answer (text,
    turn spans, reasoning spans) equals the probe renders' wherever marks give one, and marks give one
    for most rows of the common families (Qwen, Llama)."""
    srcs = _sources()
    specials = _specials(srcs)
    rows = _rows()
    convs = []
    for row in rows:
        try:
            convs.append(read_conversation(row, "openai"))
        except InputError:
            pass
    marked = {}
    for name, src in srcs.items():
        for train_reasoning in (True, False):
            t = ChatTemplate(src, variables={"eos_token": "</s>", "bos_token": "<s>"}, added_tokens=specials,
                             train_reasoning=train_reasoning)
            if t.has_generation:
                continue
            for conv in convs:
                a = _assistants(conv)
                holes = not train_reasoning and conv.counts["reasoning"] > 0
                got = S._marked(t, conv.messages, conv.kwargs, a, holes)
                if got is None:
                    continue
                want = S._probed(t, conv.messages, conv.kwargs, a, holes)  # (a row marks read renders)
                assert got == want, (name, train_reasoning, conv.messages)
                marked[name] = marked.get(name, 0) + 1
    for name in ("qwen2_5", "qwen3", "qwen3_instruct_2507", "llama3", "lfm2"):
        assert marked.get(name, 0) >= len(convs), (name, marked.get(name))  # most rows, both settings


def _renders(t, monkeypatch) -> list:
    calls = [0]
    render = ChatTemplate.render

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return render(self, *args, **kwargs)

    monkeypatch.setattr(ChatTemplate, "render", counted)
    return calls


def test_one_render_a_row_on_varied_rows(templated, monkeypatch):
    """Qwen2.5's own template (no generation blocks): once each kind of turn has been checked against the
    probes, a row of varied structure costs one render (it cost one per assistant turn more)."""
    d = templated("qwen2.5", "qwen2_5")
    source = (d / "chat_template.jinja").read_text(encoding="utf-8")
    t = ChatTemplate(source, variables={"eos_token": "<|im_end|>"}, added_tokens=["<|im_start|>", "<|im_end|>"])
    rows = [read_conversation(r, "openai") for r in tool_conversations(160, seed=4)]
    for conv in rows[:80]:
        S.conversation_parts(t, conv, compiled=False)
    assert not t.__dict__.get("_marks_off")
    calls = _renders(t, monkeypatch)
    turns = 0
    for conv in rows[80:]:
        parts, train, _ = S.conversation_parts(t, conv, compiled=False)
        turns += len(_assistants(conv))
        probed = S._probed(t, conv.messages, conv.kwargs, _assistants(conv), False)
        calls[0] -= 1 + len(_assistants(conv))  # (the check's own renders)
        assert "".join(parts) == probed[0]
        spans, at = [], 0
        for p, tr in zip(parts, train):
            if tr:
                spans.append((at, at + len(p)))
            at += len(p)
        assert spans == probed[1]
    assert calls[0] <= 80 + 4 and turns > 2 * 80  # one render a row (a new kind of turn: its check)


def _trained(parts, train) -> list:
    """The character spans of the runs of trained parts."""
    out, at = [], 0
    for p, t in zip(parts, train):
        if t and p and out and out[-1][1] == at:
            out[-1] = (out[-1][0], at + len(p))
        elif t and p:
            out.append((at, at + len(p)))
        at += len(p)
    return out


def test_structures_with_argument_objects_still_compile(templated):
    """A structure's probe render (sentinel objects for arguments) is cut by the probes, not by marks: rows
    of recurring structures with arguments as objects take compiled layouts, equal to the one-render cut."""
    from vecpack.chat.structure import _Structure

    d = templated("qwen2.5", "qwen2_5")
    source = (d / "chat_template.jinja").read_text(encoding="utf-8")
    kw = {"variables": {"eos_token": "<|im_end|>"}, "added_tokens": ["<|im_start|>", "<|im_end|>"]}
    compiled, jinja = ChatTemplate(source, **kw), ChatTemplate(source, **kw)
    compiled.__dict__["_segmented"] = None  # per-row layouts, not chat.segments' pieces (test_segments.py)
    for row in tool_conversations(12, seed=6) * 7:
        conv = read_conversation(row, "openai")
        got, want = S.conversation_parts(compiled, conv), S.conversation_parts(jinja, conv, compiled=False)
        assert "".join(got[0]) == "".join(want[0]) and _trained(*got[:2]) == _trained(*want[:2])
    made = [v for v in compiled.__dict__["_structures"].values() if type(v) is _Structure]
    assert len(made) == 12 and all(v.verified for v in made)
    assert not compiled.__dict__.get("_marks_off")  # (a misread probe render would have turned the marks off)


@pytest.mark.parametrize("case", ["strip", "copies_name", "ascii_json"])
def test_templates_marks_cannot_read_fall_back_to_probes(case):
    """A text with edge whitespace on a template that strips, a template that writes a call's name again
    (in its result), one that escapes marks (``tojson(ensure_ascii=True)``): no marked answer; the row's
    spans are the probes'."""
    src = {
        "strip": "{% for m in messages %}<|s|>{{ m.role }}\n{{ m.content | trim }}<|e|>{% endfor %}",
        "copies_name": "{% for m in messages %}<|s|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
                       "[{{ c.function.name }}]{% endfor %}{% if m.role == 'tool' %}"
                       "({{ messages[loop.index0 - 1].tool_calls[0].function.name }}){% endif %}<|e|>{% endfor %}",
        "ascii_json": "{% for m in messages %}<|s|>{{ m.role }}\n{{ m.content | tojson(ensure_ascii=True) }}<|e|>"
                      "{% endfor %}",
    }[case] + "{% if add_generation_prompt %}<|s|>assistant\n{% endif %}"
    t = ChatTemplate(src, added_tokens=["<|s|>", "<|e|>"], variables={"eos_token": "<|e|>"})
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": " padded é " if case == "strip"
                                                else "ans é", "tool_calls": [{"function": {"name": "f",
                                                                                           "arguments": {}}}]},
            {"role": "tool", "content": "r"}, {"role": "assistant", "content": "done"}]
    if case != "copies_name":
        msgs = [msgs[0], {"role": "assistant", "content": msgs[1]["content"]}]
    conv = read_conversation({"messages": msgs}, "openai")
    a = _assistants(conv)
    assert S._marked(t, conv.messages, conv.kwargs, a, False) is None
    plain = read_conversation({"messages": [msgs[0], {"role": "assistant", "content": "plain"}]}, "openai")
    if case != "ascii_json":  # (marks read this template's other rows; every ensure_ascii render may hide one)
        assert S._marked(t, plain.messages, plain.kwargs, [1], False) is not None
    assert S._turns(t, conv.messages, conv.kwargs, a, False) == S._probed(t, conv.messages, conv.kwargs, a, False)


def test_a_template_marks_misread_goes_to_the_probes_for_good():
    """Where the marks' rule and the probes differ (a literal after the content before the end-of-turn
    token, which the probes leave untrained), the first row of the kind finds it; that template's rows
    take the probes from then on, so the output never changes."""
    t = ChatTemplate("{% for m in messages %}<|s|>{{ m.role }}\n{{ m.content }}</answer><|e|>{% endfor %}"
                     "{% if add_generation_prompt %}<|s|>assistant\n{% endif %}",
                     added_tokens=["<|s|>", "<|e|>"], variables={"eos_token": "<|e|>"})
    conv = read_conversation({"messages": [{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}]}, "openai")
    a = _assistants(conv)
    marked = S._marked(t, conv.messages, conv.kwargs, a, False)
    assert marked is not None and marked != S._probed(t, conv.messages, conv.kwargs, a, False)
    assert S._turns(t, conv.messages, conv.kwargs, a, False) == S._probed(t, conv.messages, conv.kwargs, a, False)
    assert t.__dict__.get("_marks_off")


# ----------------------------------------------------------------------------- empty generation blocks

def _reference_mask(offsets, spans) -> list:
    """transformers' ``assistant_masks`` loop, written out: a token is marked when it reaches over the start
    of the first span that ends after the token starts."""
    mask, k = [0] * len(offsets), 0
    for t, (ts, te) in enumerate(offsets):
        while k < len(spans) and ts >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if te > spans[k][0]:
            mask[t] = 1
    return mask


def test_empty_runs_label_as_transformers_marks_on_random_cases():
    """``labels_from_parts(empty_runs=True)`` against the written-out rule: random tokens of 1-4 bytes,
    random spans in order, a third of them empty (at the text's start and end too)."""
    rng = random.Random(0)
    for _ in range(400):
        bytelen = np.array([rng.randint(1, 4) for _ in range(12)])
        tokens = np.array([rng.randrange(12) for _ in range(rng.randint(1, 15))], np.int32)
        total = int(bytelen[tokens].sum())
        cuts = sorted(rng.randint(0, total) for _ in range(2 * rng.randint(1, 4)))
        spans = [(a, a if rng.random() < 0.35 else b) for a, b in zip(cuts[::2], cuts[1::2])]
        sizes, train, at = [], [], 0
        for a, b in spans:
            sizes += [a - at, b - a]
            train += [False, True]
            at = b
        sizes.append(total - at)
        train.append(False)
        ends = np.cumsum(bytelen[tokens])
        offsets = list(zip((ends - bytelen[tokens]).tolist(), ends.tolist()))
        labels, trained = labels_from_parts(tokens, bytelen, sizes, train, empty_runs=True)
        want = _reference_mask(offsets, spans)
        assert ((labels != -100).astype(int).tolist(), trained) == (want, sum(want)), (spans, offsets)


_HF: dict = {}


@pytest.mark.parametrize("engine", ["fastokens", "tokenizers"])
@pytest.mark.parametrize("base", ["qwen2.5", "llama3"])
def test_empty_block_trains_the_token_over_its_place_as_transformers(templated, base, engine):
    """diffusion_gemma_training renders an empty block after a tool response; on a tokenizer without the
    template's own special tokens, ``><`` (the response's ``>`` and the next turn's ``<``) straddles it,
    and transformers marks that token. Masks equal ``assistant_masks`` on every row, and the case occurs."""
    from transformers import AutoTokenizer

    from vecpack.tokenizing.encoder import ChatEncoder

    d = templated(base, "diffusion_gemma_training")
    tok = _HF.get(base) or _HF.setdefault(base, AutoTokenizer.from_pretrained(d))  # (one load a base)
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend=engine)
    compared = straddled = 0
    for row in tool_conversations(10, seed=2):
        ref = tok.apply_chat_template(row["messages"], tools=hf_tools(row), tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(ref["input_ids"])
        assert (labels != -100).astype(int).tolist() == list(ref["assistant_masks"])
        compared += 1
        parts, train, _ = enc.template.conversation_parts(read_conversation(row, "openai"))
        text = "".join(parts)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        at = 0
        for p, tr in zip(parts, train):
            if tr and not p:
                straddled += sum(1 for k, (s, e) in enumerate(offsets) if s < at < e and labels[k] != -100)
            at += len(p)
    assert compared == 10 and straddled > 0


# ----------------------------------------------------------------------------- the varied rows

def test_tool_conversations_vary_and_render_as_transformers(templated):
    """Same seed, same rows; 1-4 tools, 1-5 assistant turns, parallel calls each answered; no two
    consecutive rows of one structure; few repeated texts; Qwen2.5's template renders them as transformers."""
    from transformers import AutoTokenizer

    rows = tool_conversations(200, seed=7)
    assert json.dumps(rows) == json.dumps(tool_conversations(200, seed=7))
    shapes = []
    for row in rows:
        msgs = row["messages"]
        assert 1 <= len(row["tools"]) <= 4
        assert 1 <= sum(m["role"] == "assistant" for m in msgs) <= 5
        calls = [c for m in msgs for c in m.get("tool_calls", [])]
        assert [m["tool_call_id"] for m in msgs if m["role"] == "tool"] == [c["id"] for c in calls]
        shapes.append((len(row["tools"]), tuple((m["role"], len(m.get("tool_calls", []))) for m in msgs)))
    assert all(a != b for a, b in zip(shapes, shapes[1:]))
    assert any(len(m.get("tool_calls", [])) > 1 for r in rows for m in r["messages"])
    texts = [m["content"] for r in rows for m in r["messages"] if m.get("content")]
    assert len(set(texts)) > 0.9 * len(texts)
    d = templated("qwen2.5", "qwen2_5")
    tok = AutoTokenizer.from_pretrained(d)
    t = ChatTemplate((d / "chat_template.jinja").read_text(encoding="utf-8"))
    for row in rows[:20]:
        conv = read_conversation(row, "openai")
        assert t.render(conv.messages, extra=conv.kwargs) == tok.apply_chat_template(
            row["messages"], tools=row["tools"], tokenize=False)
