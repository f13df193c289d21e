"""Generated agentic rows for the tests: tool schemas, parallel calls, results, reasoning, awkward text."""

import json
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
    """A copy of tokenizer directory ``base`` whose chat template is TRL's ``name``."""
    out = pathlib.Path(out)
    if not out.exists():
        shutil.copytree(base, out)
        (out / "chat_template.jinja").write_text((trl_templates() / f"{name}.jinja").read_text(encoding="utf-8"),
                                                 encoding="utf-8")
    return out


def hf_tools(row: dict):
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools
