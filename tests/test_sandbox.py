"""vecpack.chat.sandbox.FastSandbox: the same output, and the same errors, as jinja2's ImmutableSandboxedEnvironment."""

import json
import re

import pytest
from agentic_data import AWKWARD, MISTRAL_TEKKEN_TEMPLATE, agentic_rows, trl_templates

from vecpack.chat.conversation import read_conversation
from vecpack.chat.template import compile_jinja
from vecpack.testing import QWEN_CHAT_TEMPLATE

HOSTILE = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ m.__class__ }}",
    "{{ m.__class__.__name__ }}",
    "{{ m.__init__() }}",
    "{{ m['__class__'].x }}",
    "{{ (m | attr('__class__')).__name__ }}",
    "{{ m.role.__class__.__name__ }}",
    "{{ m.get.__self__.x }}",
    "{{ lipsum.__globals__.os }}",
    "{{ raise_exception.__globals__['json'] }}",
    "{{ strftime_now.__code__.co_code }}",
    "{{ dict.fromkeys.__func__() }}",
    "{{ dict(a=1).update({}) }}",
    "{{ '{x.__class__}'.format_map({'x': m}) }}{{ '{0.__class__}'.format(m).x }}",
    "{% set ns = namespace(a=1) %}{{ ns.__dict__.x }}",
    "{% for x in messages %}{{ loop._iterator.x }}{% endfor %}",
    "{{ m.__class__.__subclasses__() }}",
    "{{ m.__init__ }}",
    "{{ m['__class__'] }}",
    "{{ m | attr('__class__') }}",
    "{{ m | attr('role') }}{{ m | attr('items') is callable }}",
    "{{ m.role.__class__ }}",
    "{{ m.content.strip().__class__.__base__ }}",
    "{{ m._private }}{{ m._missing is defined }}",
    "{{ m.get.__self__ }}",
    "{{ m.items.__self__ }}",
    "{{ m.update({'role': 'x'}) }}{{ m.role }}",
    "{{ m.pop('role') }}",
    "{{ m.setdefault('x', 1) }}",
    "{{ m.clear() }}",
    "{{ m.popitem() }}",
    "{{ messages.append(1) }}",
    "{{ messages.pop() }}",
    "{{ messages.sort() }}",
    "{{ messages.__len__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ range.__self__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__code__ }}",
    "{{ dict.__call__.__globals__ }}",
    "{{ dict.fromkeys.__func__ }}",
    "{{ dict(a=1).update }}",
    "{{ dict(a=1).__class__ }}",
    "{{ 'a{0.__class__}'.format(m) }}",
    "{{ '{0.role}'.format(m) }}",
    "{{ '{x.__class__}'.format_map({'x': m}) }}",
    "{{ s.format }}",
    "{{ ('<b>' | safe).format(m) }}",
    "{{ s.upper() }}{{ s.split() }}{{ s.__len__() }}",
    "{{ s.mro }}{{ s.maketrans('a', 'b') }}",
    "{% set ns = namespace(_x=1) %}",
    "{% set ns = namespace(a=1) %}{% set ns._b = 2 %}{{ ns._b }}",
    "{% set ns = namespace(a=1) %}{{ ns.__dict__ }}{{ ns._Namespace__attrs }}{{ ns.a }}",
    "{% for x in messages %}{{ loop.__class__ }}{{ loop._iterator }}{% endfor %}",
    "{% for x in [1, 2, 3] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
    "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.depth }}{{ loop.depth0 }}{{ loop.previtem }}{{ loop.nextitem }}"
    "{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }}{% endfor %}",
    "{% for x in [[1], [2]] recursive %}{{ loop.depth }}{% if x is iterable %}{{ loop(x) }}{% endif %}"
    "{% endfor %}",
    "{{ m.missing }}",
    "{{ m.missing.deeper }}",
    "{{ m.content.missing }}",
    "{{ m.keys() | list }}{{ m.values() | list }}{{ m.copy() }}{{ m.get('role') }}",
    "{{ m | attr(['role']) }}",
    "{{ messages[0].role }}{{ messages[0]['content'] }}{{ messages[5] is defined }}",
]


def _outcome(template, **context):
    """``(error name or "ok", text)``, object addresses left out (a wrapped ``str.format`` is made per access)."""
    try:
        out = "ok", template.render(**context)
    except Exception as e:  # noqa: BLE001 - the exact error is what is compared
        out = type(e).__name__, str(e)
    return out[0], re.sub(" at 0x[0-9a-f]+", "", out[1])


def _context():
    m = {"role": "user", "content": " hi ", "_private": "p"}
    return {"m": m, "messages": [m, {"role": "assistant", "content": "yo"}], "s": "a text"}


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_templates_fail_as_in_the_plain_sandbox(source):
    """Every lookup the sandbox refuses is refused the same way (same error, same message), every one it
    allows gives the same value; the template's mutations of its context are refused alike."""
    fast_ctx, plain_ctx = _context(), _context()
    fast = _outcome(compile_jinja(source), **fast_ctx)
    plain = _outcome(compile_jinja(source, fast=False), **plain_ctx)
    assert fast == plain
    assert fast_ctx == plain_ctx == _context()  # nothing mutated


def test_hostile_templates_do_reach_the_sandbox():
    """The list holds what the sandbox refuses (else the comparison above proves nothing)."""
    refused = [s for s in HOSTILE if _outcome(compile_jinja(s, fast=False), **_context())[0] == "SecurityError"]
    assert len(refused) >= 20


def test_a_lookup_too_direct_is_caught(monkeypatch):
    """A fast path that answered dict method names from the keys (``m.update`` -> ``m['update']``) fails the
    comparison: the sandbox refuses ``update`` as a mutation, the broken path finds no such key."""
    from vecpack.chat import sandbox

    source = "{{ m.update({'role': 'x'}) }}"
    monkeypatch.setattr(sandbox, "_DICT_ATTRS", frozenset())
    assert _outcome(compile_jinja(source), **_context())[0] == "UndefinedError"
    assert _outcome(compile_jinja(source, fast=False), **_context())[0] == "SecurityError"


def test_fast_sandbox_is_used():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from vecpack.chat.sandbox import FastSandbox

    fast, plain = compile_jinja("x"), compile_jinja("x", fast=False)
    assert type(fast.environment) is FastSandbox
    assert type(plain.environment) is ImmutableSandboxedEnvironment
    assert type(fast.globals) is dict and set(fast.globals) == set(plain.globals)  # one dict, the same names


def _sources():
    out = [("qwen2.5-fixture", QWEN_CHAT_TEMPLATE), ("mistral-tekken", MISTRAL_TEKKEN_TEMPLATE)]
    try:
        out += [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(trl_templates().glob("*.jinja"))]
    except ImportError:  # pragma: no cover - trl is a test dependency
        pass
    return out


def _conversations():
    convs = []
    for row in agentic_rows(6, seed=3):
        c = read_conversation(row, "openai")
        convs.append((c.messages, c.kwargs))
    plain = [{"role": "system", "content": "sys " + AWKWARD[1]}, {"role": "user", "content": AWKWARD[7]},
             {"role": "assistant", "content": "<think>\nhm\n</think>\n\n" + AWKWARD[3]},
             {"role": "user", "content": ""}, {"role": "assistant", "content": AWKWARD[5]}]
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in plain]  # vision templates
    convs += [(plain, {}), (plain[1:3], {}), (plain[:2], {"enable_thinking": False}), (parts, {}), (parts[1:3], {})]
    return convs


@pytest.mark.parametrize("name,source", _sources(), ids=[n for n, _ in _sources()])
def test_chat_templates_render_the_same(name, source):
    """TRL's chat templates and the test fixtures render byte-identical text (or the same error) in both."""
    fast, plain = compile_jinja(source), compile_jinja(source, fast=False)
    variables = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    rendered = 0
    for k, (messages, kwargs) in enumerate(_conversations()):
        for gen in (False, True) if k in (0, 6) else (False,):
            context = {"tools": None, "documents": None, **variables, **kwargs, "messages": messages,
                       "add_generation_prompt": gen}
            got = _outcome(fast, **json.loads(json.dumps(context)))
            assert got == _outcome(plain, **json.loads(json.dumps(context)))
            rendered += got[0] == "ok"
    assert rendered  # each template renders some of them
