"""Varied tool-calling conversations for tests and benchmarks: agentic rows as real sets vary.

:func:`tool_conversations` writes OpenAI/TRL rows (``messages`` and ``tools``)
whose structure changes from row to row (1-4 tools, 1-5 assistant turns,
parallel calls and their results, follow-up questions, reasoning on some
turns) and whose texts carry names, numbers, amounts and dates, so that few
messages repeat. Re-exported by :mod:`vecpack.testing`.
"""

from __future__ import annotations

import json
import random

__all__ = ["tool_conversations"]

_TC_FIRST = ("Ana", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Giulia", "Hiroshi", "Inés", "Jonas", "Kavya", "Lars",
             "Mateus", "Nadia", "Oluwaseun", "Priya", "Quentin", "Rafael", "Sofia", "Tomás", "Uma", "Viktor", "Wen",
             "Yusuf", "Zoë")
_TC_LAST = ("Almeida", "Berg", "Costa", "Dubois", "Eze", "Fischer", "García", "Haddad", "Ivanova", "Jensen", "Kowalski",
            "Lopes", "Müller", "Nakamura", "Okafor", "Patel", "Rossi", "Silva", "Tanaka", "Weber")
_TC_CITIES = ("Lisbon", "São Paulo", "Osaka", "Nairobi", "Reykjavík", "Montréal", "Kraków", "Dubai", "Lima", "Hanoi",
              "Zürich", "Cape Town", "Austin", "Bergen", "Porto Alegre", "Seoul", "Tbilisi", "Valparaíso")
_TC_TOOLS = {  # name: (description, {argument: (JSON type, description)})
    "get_weather": ("Current weather and forecast for a city.",
                    {"city": ("string", "City name"), "days": ("integer", "Forecast days, 1-10"),
                     "units": ("string", "metric or imperial")}),
    "search_flights": ("Search flights between two airports on a date.",
                       {"origin": ("string", "IATA code"), "destination": ("string", "IATA code"),
                        "date": ("string", "YYYY-MM-DD"), "passengers": ("integer", "Number of passengers")}),
    "book_hotel": ("Book a hotel room.", {"city": ("string", "City"), "check_in": ("string", "YYYY-MM-DD"),
                                          "nights": ("integer", "Nights"), "guest": ("string", "Guest name")}),
    "convert_currency": ("Convert an amount between currencies.",
                         {"amount": ("number", "Amount"), "from": ("string", "ISO 4217 code"),
                          "to": ("string", "ISO 4217 code")}),
    "get_stock_price": ("Latest price of a stock ticker.", {"ticker": ("string", "Ticker symbol")}),
    "create_event": ("Create a calendar event.", {"title": ("string", "Title"), "start": ("string", "ISO datetime"),
                                                  "attendees": ("array", "Emails of the attendees")}),
    "send_email": ("Send an email.", {"to": ("string", "Recipient"), "subject": ("string", "Subject"),
                                      "body": ("string", "Body text")}),
    "lookup_order": ("Look up an order by its number.", {"order_id": ("string", "Order number"),
                                                         "include_items": ("boolean", "List the items")}),
    "route_distance": ("Driving distance and time between two places.",
                       {"from": ("string", "Start"), "to": ("string", "End"), "avoid_tolls": ("boolean", "")}),
    "query_database": ("Run a read-only SQL query.", {"sql": ("string", "SELECT statement"),
                                                      "limit": ("integer", "Row limit")}),
    "translate_text": ("Translate a text.", {"text": ("string", "Text"), "target": ("string", "Language code")}),
    "unit_convert": ("Convert a quantity between units.", {"value": ("number", "Value"), "unit": ("string", "From"),
                                                           "to_unit": ("string", "To")}),
}


def tool_conversations(n: int, *, seed: int = 0, reasoning: bool = True) -> list[dict]:
    """``n`` varied tool-calling conversations (OpenAI/TRL rows: ``messages`` and ``tools``), as agentic
    training data looks: no two consecutive rows of the same structure.

    Each row offers 1-4 tools (their JSON schemas) and has 1-5 assistant turns: each but the last makes
    one to three calls (parallel calls; arguments as objects) answered by one ``tool`` message per call
    (with its ``tool_call_id`` and ``name``), sometimes after a user's follow-up; the last answers in
    text. A system prompt on some rows; with ``reasoning``, a ``reasoning_content`` on some assistant
    turns (templates that do not render it drop it). Texts carry names, numbers, amounts and dates, so
    few messages repeat. Same ``n``, ``seed`` and ``reasoning``: the same rows.

    >>> rows = tool_conversations(3, seed=1)
    >>> [sorted(r) for r in rows]
    [['messages', 'tools'], ['messages', 'tools'], ['messages', 'tools']]
    >>> all(1 <= sum(m["role"] == "assistant" for m in r["messages"]) <= 5 for r in rows)
    True
    """
    rng = random.Random(seed)
    names = sorted(_TC_TOOLS)

    def person() -> str:
        return f"{rng.choice(_TC_FIRST)} {rng.choice(_TC_LAST)}"

    def date() -> str:
        return f"20{rng.randint(23, 27)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"

    def value(tool: str, kind: str, arg: str):
        if kind == "integer":
            return rng.randint(1, 12)
        if kind == "number":
            return round(rng.uniform(1, 5000), 2)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "array":
            return [f"{rng.choice(_TC_FIRST).lower()}@example.{rng.choice(('com', 'org', 'io'))}"
                    for _ in range(rng.randint(1, 3))]
        if arg in ("date", "check_in"):
            return date()
        if arg == "start":
            return f"{date()}T{rng.randint(7, 19):02d}:{rng.choice(('00', '15', '30', '45'))}:00"
        if arg in ("origin", "destination"):
            return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVWXZ") for _ in range(3))
        if arg in ("from", "to") and kind == "string" and "currency" in tool:
            return rng.choice(("EUR", "USD", "BRL", "JPY", "KES", "GBP"))
        if arg == "units":
            return rng.choice(("metric", "imperial"))
        if arg == "target":
            return rng.choice(("pt", "de", "ja", "sw", "fr"))
        if arg in ("unit", "to_unit"):
            return rng.choice(("km", "mi", "kg", "lb", "l", "gal"))
        if arg == "ticker":
            return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(2, 4)))
        if arg == "sql":
            return f"SELECT id, total FROM orders WHERE customer = '{person()}' AND day >= '{date()}'"
        if arg == "order_id":
            return f"ORD-{rng.randint(10000, 99999)}"
        if arg == "guest" or arg == "to" and tool == "send_email":
            return person()
        if arg in ("subject", "title"):
            return f"{rng.choice(('Trip to', 'Meeting in', 'Invoice for', 'Follow-up on'))} {rng.choice(_TC_CITIES)}"
        if arg in ("body", "text"):
            return (f"Hi {person()}, the {rng.choice(('report', 'booking', 'invoice'))} for {date()} comes to "
                    f"{rng.randint(20, 9000)} {rng.choice(('EUR', 'USD', 'BRL'))}.")
        return rng.choice(_TC_CITIES)

    def schema(name: str) -> dict:
        desc, params = _TC_TOOLS[name]
        props = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
        for v in props.values():
            if v["type"] == "array":
                v["items"] = {"type": "string"}
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": list(params)[:1]}}}

    def result(name: str, args: dict) -> str:
        body = {"status": rng.choice(("ok", "ok", "ok", "partial")), "tool": name,
                "checked_at": f"{date()}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}Z"}
        if name == "get_weather":
            body["forecast"] = [{"day": date(), "high_c": rng.randint(-5, 38), "rain_mm": round(rng.random() * 20, 1)}
                                for _ in range(min(3, args.get("days", 1)))]
        elif name == "search_flights":
            body["flights"] = [{"flight": f"{rng.choice(('TP', 'LA', 'KL', 'NH'))}{rng.randint(100, 9999)}",
                                "price": rng.randint(90, 1900), "stops": rng.randint(0, 2)}
                               for _ in range(rng.randint(1, 3))]
        else:
            body["value"] = round(rng.uniform(0, 10000), 2)
            body["note"] = f"{person()} updated this on {date()}"
        return json.dumps(body, ensure_ascii=False)

    asks = ("Can you check {x} for me?", "I need {x} before {d}.", "Please look into {x}, my manager {p} asked.",
            "What about {x}? We leave on {d}.", "Could you sort out {x} for {p}?")
    answers = ("Done: {x}. Anything else, {p}?", "Here is what I found for {d}: {x}.",
               "All set. {x}. I also noted the date {d}.", "{x} Let me know if {p} needs changes.")
    rows, last = [], None
    for _ in range(n):
        while True:
            tools = rng.sample(names, rng.randint(1, 4))
            turns = rng.randint(1, 5)
            calls_per = [rng.randint(1, 3) for _ in range(turns - 1)]
            system = rng.random() < 0.6
            key = (len(tools), turns, tuple(calls_per), system)
            if key != last:
                break
        last = key
        msgs = []
        if system:
            msgs.append({"role": "system", "content": f"You are a travel and office assistant for {person()}. "
                                                      f"Today is {date()}."})
        what = f"{rng.choice(tools).replace('_', ' ')} in {rng.choice(_TC_CITIES)}"
        msgs.append({"role": "user", "content": rng.choice(asks).format(x=what, d=date(), p=person())})
        for t in range(turns):
            a: dict = {"role": "assistant"}
            if reasoning and rng.random() < 0.3:
                a["reasoning_content"] = (f"The user wants {what}; {len(tools)} tools, turn {t + 1} of {turns}, "
                                          f"date {date()}.")
            if t < turns - 1:
                calls = []
                for _ in range(calls_per[t]):
                    name = rng.choice(tools)
                    args = {k: value(name, kind, k) for k, (kind, _) in _TC_TOOLS[name][1].items()
                            if k == next(iter(_TC_TOOLS[name][1])) or rng.random() < 0.7}
                    calls.append({"id": f"call_{rng.getrandbits(40):010x}", "type": "function",
                                  "function": {"name": name, "arguments": args}})
                a["content"] = rng.choice(("", "", f"Checking {calls[0]['function']['name']} now."))
                a["tool_calls"] = calls
                msgs.append(a)
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                                 "content": result(c["function"]["name"], c["function"]["arguments"])})
                if rng.random() < 0.25:
                    msgs.append({"role": "user", "content": f"Also, {rng.choice(tools).replace('_', ' ')} for "
                                                            f"{person()} on {date()}, please."})
            else:
                x = (f"{rng.randint(2, 980)} {rng.choice(('EUR', 'USD', 'km', 'rooms', 'flights'))} in "
                     f"{rng.choice(_TC_CITIES)}")
                a["content"] = rng.choice(answers).format(x=x, d=date(), p=person())
                msgs.append(a)
        rows.append({"messages": msgs, "tools": [schema(name) for name in tools]})
    return rows
