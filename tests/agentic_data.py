"""Generated agentic rows for the tests: tool schemas, parallel calls, results, reasoning, awkward text."""

import json
import os
import pathlib
import random
import shutil

AWKWARD = ["plain", 'with "quotes"', "back\\slash", "ünïcödé ação", "emoji 😀🎉", '{"nested": {"json": [1, 2]}}', "",
           "tab\there\nnewline", "中文 日本語"]


def tool_schemas(n: int = 3) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{k}", "description": f"Does thing {k}.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"},
                                                        "n": {"type": "integer"}}, "required": ["q"]}}}
            for k in range(n)]


def agentic_rows(n: int, seed: int = 0, *, reasoning: bool = True, parallel: bool = True) -> list[dict]:
    """OpenAI/TRL rows: calls with arguments as objects and as JSON text, null / empty / text content,
    results with ids and names, per-row tools as a list and as JSON text, reasoning on some turns."""
    rng = random.Random(seed)
    tools = tool_schemas()
    rows = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": "You are an agent. " + rng.choice(AWKWARD)})
        for turn in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": f"Q{turn} " + rng.choice(AWKWARD)})
            if rng.random() < 0.7:
                calls = []
                for c in range(rng.randint(1, 3 if parallel else 1)):
                    args = {"q": rng.choice(AWKWARD), "n": rng.randint(0, 9)}
                    calls.append({"type": "function", "id": f"call_{turn}_{c}", "function": {
                        "name": f"tool_{rng.randint(0, 2)}",
                        "arguments": args if rng.random() < 0.5 else json.dumps(args, ensure_ascii=False)}})
                a = {"role": "assistant", "content": rng.choice([None, "", "Let me check."]), "tool_calls": calls}
                if reasoning and rng.random() < 0.5:
                    a["reasoning_content"] = "thinking " + rng.choice(AWKWARD)
                msgs.append(a)
                for c in calls:
                    t = {"role": "tool", "content": "result " + rng.choice(AWKWARD)}
                    if rng.random() < 0.6:
                        t["tool_call_id"] = c["id"]
                    if rng.random() < 0.6:
                        t["name"] = c["function"]["name"]
                    msgs.append(t)
            a = {"role": "assistant", "content": "Answer " + rng.choice(AWKWARD)}
            if reasoning and rng.random() < 0.5:
                a["reasoning_content"] = "because " + rng.choice(AWKWARD)
            msgs.append(a)
        row = {"messages": msgs}
        x = rng.random()
        if x < 0.4:
            row["tools"] = tools
        elif x < 0.8:
            row["tools"] = json.dumps(tools)
        rows.append(row)
    return rows


def write_jsonl(path, rows) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def trl_templates() -> pathlib.Path:
    import trl

    return pathlib.Path(trl.__file__).parent / "chat_templates"


def with_template(base: pathlib.Path, name: str, out: pathlib.Path) -> pathlib.Path:
    """A copy of tokenizer directory ``base`` whose chat template is TRL's ``name`` (its ``tokenizer.json`` a
    symlink to ``base``'s, as a hub cache's snapshots share a file, so that one engine serves them all)."""
    out = pathlib.Path(out)
    if not out.exists():
        shutil.copytree(base, out, ignore=shutil.ignore_patterns("tokenizer.json"))
        os.symlink(pathlib.Path(base).resolve() / "tokenizer.json", out / "tokenizer.json")
        (out / "chat_template.jinja").write_text((trl_templates() / f"{name}.jinja").read_text(encoding="utf-8"),
                                                 encoding="utf-8")
    return out


def hf_tools(row: dict):
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def same_structure_rows(n: int, seed: int = 0, *, parallel: bool = True) -> list[dict]:
    """Rows of six structures (from :func:`agentic_rows`), each repeated with other texts and arguments:
    what a dataset of recurring shapes looks like to the compiled layouts."""
    rng = random.Random(seed)
    base = agentic_rows(6, seed=seed, parallel=parallel)
    out = []
    for k in range(n):
        row = json.loads(json.dumps(base[k % 6]))
        for m in row["messages"]:
            if isinstance(m.get("content"), str) and m["content"]:
                m["content"] = rng.choice(AWKWARD[:-3]) + str(k)
            for c in m.get("tool_calls", []):
                args = {"q": rng.choice(AWKWARD), "n": k, "deep": {"list": [k, None, True]}}
                c["function"]["arguments"] = (args if isinstance(c["function"]["arguments"], dict)
                                              else json.dumps(args, ensure_ascii=False))
            if "reasoning_content" in m:
                m["reasoning_content"] = "r " + rng.choice(AWKWARD[:-3])
        out.append(row)
    return out


def xlam_rows(n: int, seed: int = 0) -> list[dict]:
    """Single-turn function calling as the popular public sets have it: a per-row list of tools,
    a query, one assistant turn of one to three calls (arguments as JSON text)."""
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        tools = tool_schemas(rng.randint(1, 5))
        for t in tools:
            t["function"]["description"] += f" Variant {rng.randint(0, 999)}."
        calls = [{"type": "function", "function": {"name": rng.choice(tools)["function"]["name"],
                                                   "arguments": json.dumps({"q": rng.choice(AWKWARD[:6]), "n": k})}}
                 for _ in range(rng.randint(1, 3))]
        rows.append({"messages": [{"role": "user", "content": f"Request {k}: " + rng.choice(AWKWARD[:6])},
                                  {"role": "assistant", "content": "", "tool_calls": calls}],
                     "tools": json.dumps(tools)})
    return rows


_ARG_KEYS = ("q", "city", "days", "items", "flag")  # one order: a unified Arrow struct keeps the first-seen order
_TOOL_ARGS = {"search": ("q",), "weather": ("city", "days"), "basket": ("items", "flag"),
              "mixed": ("q", "days", "flag"), "every": _ARG_KEYS}


def _schema(name: str, keys) -> dict:
    types = {"q": ("string", "the query"), "city": ("string", "a city"), "days": ("integer", "how many days"),
             "items": ("array", "the items"), "flag": ("boolean", "whether")}
    return {"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": {
        "type": "object", "properties": {k: {"type": types[k][0], "description": types[k][1]} for k in keys},
        "required": list(keys[:1])}}}


def heterogeneous_rows(n: int, seed: int = 0, *, as_text: bool = False) -> list[dict]:
    """Tool rows whose arguments and schemas differ from row to row (keys a struct column unifies),
    written so that a unified struct can give them back (see ``vecpack.inputs.columnar``): keys in one
    order (row 0 has every key, so the union keeps it), no JSON null inside arguments or schemas,
    integers where integers. ``as_text``: arguments and
    tools as JSON text (the form TRL advises for Arrow and Parquet)."""
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        names = ["every"] if k == 0 else rng.sample(sorted(_TOOL_ARGS), rng.randint(1, 3))  # row 0: every key
        tools = [_schema(t, _TOOL_ARGS[t]) for t in names]
        msgs = [{"role": "user", "content": f"Task {k}: " + rng.choice(AWKWARD)}]
        calls = []
        for c in range(rng.randint(1, 2)):
            name = rng.choice(names)
            values = {"q": rng.choice(AWKWARD), "city": rng.choice(AWKWARD[:5]), "days": rng.randint(1, 9),
                      "items": [rng.choice(AWKWARD[:4]) for _ in range(rng.randint(0, 2))], "flag": rng.random() < .5}
            args = {key: values[key] for key in _ARG_KEYS if key in _TOOL_ARGS[name]}
            call = {"type": "function", "function": {"name": name, "arguments": args}}
            if k == c == 0 or rng.random() < 0.5:
                call = {"id": f"call_{k}_{c}", **call}
            calls.append(call)
        a = {"role": "assistant", "content": rng.choice([None, "", "On it."]), "tool_calls": calls}
        if rng.random() < 0.5:
            a["reasoning_content"] = "think " + rng.choice(AWKWARD)
        msgs.append(a)
        for call in calls:
            t = {"role": "tool", "content": json.dumps({"ok": k}), "name": call["function"]["name"]}
            if "id" in call and rng.random() < 0.7:
                t["tool_call_id"] = call["id"]
            msgs.append(t)
        msgs.append({"role": "assistant", "content": "Done " + rng.choice(AWKWARD)})
        if as_text:
            for call in calls:
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
        rows.append({"messages": msgs, "tools": json.dumps(tools) if as_text else tools})
    return rows


# Mistral-Nemo's (Tekken, v3) tool-calling chat template, as its tokenizer_config.json carries it
MISTRAL_TEKKEN_TEMPLATE = """\
{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and \
message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate \
user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}
        {{- "[TOOL_CALLS][" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS]{"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial \
optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_MISTRAL_SPECIALS = ("<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                     "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]")


def tekken_like(llama3_dir, out) -> pathlib.Path:
    """A Mistral-Nemo-style (Tekken) tokenizer from the offline Llama 3 fixture: byte-level BPE split by
    Tekken's pattern, Mistral's control tokens as special added tokens, Mistral-Nemo's tool template."""
    out = pathlib.Path(out)
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tj = json.loads((pathlib.Path(llama3_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    for tok, name in zip(tj["added_tokens"], _MISTRAL_SPECIALS):
        tok["content"] = name
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": TEKKEN_PATTERN}
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 131072, "chat_template": MISTRAL_TEKKEN_TEMPLATE, "clean_up_tokenization_spaces": False}),
        encoding="utf-8")
    return out


def mistral_rows(n: int, seed: int = 0) -> list[dict]:
    """:func:`agentic_rows` as Mistral's template takes them: call ids of nine letters and digits, every
    result with its call's id, one result message per call."""
    rows = agentic_rows(n, seed=seed)
    for r, row in enumerate(rows):
        ids = {}
        for m in row["messages"]:
            for call in m.get("tool_calls", []):
                ids[call["id"]] = call["id"] = f"{r:04d}x{len(ids):04d}"[-9:]
        calls = iter(ids.values())
        for m in row["messages"]:
            if m["role"] == "tool":
                m["tool_call_id"] = next(calls)
    return rows


def pack_documents(packs) -> list:
    """Every document's ids (lists) in packs that carry ``input_ids`` and ``seq_lens``, in pack order."""
    import numpy as np

    out = []
    for pack in packs:
        ids, at = np.asarray(pack["input_ids"]), 0
        for n in np.asarray(pack["seq_lens"]).tolist():
            out.append(ids[at:at + n].tolist())
            at += n
    return out
