"""Fixtures beyond :mod:`vecpack.testing`: varied chat and tool rows, and SentencePiece-family tokenizers.

Seed-shaped chat rows as varied as real data: :func:`make_varied_chats`.

:func:`vecpack.testing.make_short_chats` writes the seed's shape (one system
prompt, one to three short exchanges, about 164 Qwen2.5 tokens a row) from ten
phrases: in 50k rows, about 110 distinct messages and 104 distinct words. Every
cache of pieces and prefixes hits on them far more often than on real chat.
These rows keep that shape, and are as varied as the seed's real file (legal
Q&A): most messages are drawn from a pool of common ones (greetings, standard
answers) with Zipf-like weights, and about a fifth are filled in afresh from
templates with names, process numbers, dates, amounts, cities and courts, so
100k rows hold tens of thousands of distinct messages and words.

Generated with numpy, all choices for all rows at once, and written as JSON
lines without a per-row ``json.dumps``: every piece is JSON-safe text (no quote,
backslash or control character; non-ASCII kept as ``ensure_ascii=False`` keeps
it), so a line is ``json.dumps(row, ensure_ascii=False)`` byte for byte
(``tests/test_varied_chats.py`` checks it).

Varied tool-calling conversations for tests and benchmarks: agentic rows as real sets vary.

:func:`tool_conversations` writes OpenAI/TRL rows (``messages`` and ``tools``)
whose structure changes from row to row (1-4 tools, 1-5 assistant turns,
parallel calls and their results, follow-up questions, reasoning on some
turns) and whose texts carry names, numbers, amounts and dates, so that few
messages repeat. Re-exported by :mod:`vecpack.testing`.

Offline SentencePiece-family fixture tokenizers: Mistral v3 (dummy prefix) and a Gemma-like one.

Built from the SentencePiece ``.model`` that ``mistral-common`` ships (read
by a small protobuf reader here: neither ``sentencepiece`` nor ``protobuf``
is needed); nothing is downloaded. Also re-exported by :mod:`vecpack.testing`.
"""

from __future__ import annotations

import json
import os
import pathlib
import random

import numpy as np

__all__ = ["GEMMA_CHAT_TEMPLATE", "MISTRAL_SP_CHAT_TEMPLATE", "make_gemma_like_tokenizer",
           "make_mistral_sp_tokenizer", "make_varied_chats", "sp_model_pieces", "tool_conversations"]


#: The system prompt of every row (the seed's; :data:`vecpack.testing.SHORT_CHAT_SYSTEM`).
SYSTEM = ("Você é o EscavAI, o assistente virtual do Escavador. Seu objetivo é tirar dúvidas "
          "jurídicas dos usuários do Escavador da melhor forma possível")

_FIRST = ("Ana Bruno Carla Daniel Eduarda Felipe Gabriela Heitor Isabela João Karina Lucas Mariana Nicolas "
          "Olívia Pedro Quitéria Rafael Sofia Thiago Úrsula Vitor Wesley Yasmin Zilda Antônio Beatriz Caio "
          "Débora Enzo Fernanda Gustavo Helena Igor Juliana Kléber Larissa Marcelo Natália Otávio Patrícia "
          "Renata Sérgio Tatiane Valéria Wagner Aline Benedito Cecília Diogo Elaine Fábio Giovana Hugo Irene "
          "Joaquim Lívia Márcio Nair Orlando Paula Rodrigo Sandra Tomás Vanessa Alessandro Bianca Cristiano "
          "Denise Everton Flávia Gilberto Heloísa Ivan Jéssica Leandro Mônica Nelson Priscila Raimundo Simone").split()
_LAST = ("Silva Santos Oliveira Souza Rodrigues Ferreira Alves Pereira Lima Gomes Costa Ribeiro Martins Carvalho "
         "Almeida Lopes Soares Fernandes Vieira Barbosa Rocha Dias Nascimento Andrade Moreira Nunes Marques "
         "Machado Mendes Freitas Cardoso Ramos Gonçalves Santana Teixeira Araújo Moura Cavalcanti Pinto Correia "
         "Monteiro Batista Campos Rezende Siqueira Tavares Brandão Queiroz Magalhães Guimarães Pacheco Sampaio "
         "Fonseca Peixoto Bittencourt Coelho Xavier Leite Barros Farias Medeiros Aragão Prado Figueiredo").split()
_CITY = ("São Paulo|Rio de Janeiro|Belo Horizonte|Salvador|Fortaleza|Curitiba|Recife|Porto Alegre|Manaus|Belém|"
         "Goiânia|Campinas|São Luís|Maceió|Natal|Teresina|João Pessoa|Florianópolis|Vitória|Cuiabá|Aracaju|"
         "Londrina|Ribeirão Preto|Uberlândia|Sorocaba|Niterói|Juiz de Fora|Joinville|Santos|Campo Grande|"
         "Feira de Santana|Caxias do Sul|Pelotas|Maringá|Anápolis|Petrolina|Mossoró|Blumenau|Chapecó|Palmas").split("|")
_COURT = ("TJSP TJRJ TJMG TJBA TJCE TJPR TJPE TJRS TJAM TJPA TJGO TJSC TJES TJMT TJDFT TRT-2 TRT-1 TRT-3 TRT-4 "
          "TRT-15 TRF-1 TRF-3 TRF-4 STJ STF TST JEC").split()
_MONTH = ("janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro").split()
_TOPIC = ("pensão alimentícia|guarda compartilhada|rescisão indireta|horas extras|danos morais|usucapião|"
          "inventário|divórcio consensual|despejo por falta de pagamento|revisão de aposentadoria|auxílio-doença|"
          "cobrança indevida|negativação do nome|plano de saúde|acidente de trânsito|contrato de aluguel|"
          "vínculo empregatício|FGTS não depositado|seguro-desemprego|execução fiscal|protesto de título|"
          "partilha de bens|investigação de paternidade|reintegração de posse|busca e apreensão|"
          "recuperação judicial|penhora de salário|BPC/LOAS|licença-maternidade|adicional de insalubridade").split("|")

# Templates: {n} a name, {p} a process number, {d} a date, {c} a city, {v} an amount, {k} a count of
# days, {t} a court, {s} a topic, {m} a month, {y} a year.
_ASK = (
    "Bom dia! Meu nome é {n} e queria saber do processo {p}.",
    "Qual o andamento do processo {p} no {t}?",
    "Tenho uma audiência marcada para {d} em {c}, o que devo levar?",
    "Fui citado em {d} num processo de {s}, qual é o prazo para contestar?",
    "Meu advogado, Dr. {n}, sumiu. Como acompanho o processo {p}?",
    "A empresa me deve {v} de {s}. Vale a pena entrar na justiça?",
    "O juiz de {c} deu sentença em {d}. Ainda cabe recurso?",
    "Recebi uma intimação do {t} sobre {s}, o que isso significa?",
    "Quanto tempo demora um processo de {s} em {c}?",
    "Meu nome apareceu no processo {p}, mas eu não conheço {n}. O que faço?",
    "Posso pedir {s} se trabalhei {k} meses sem carteira assinada?",
    "A audiência de conciliação foi remarcada para {d}. Preciso ir?",
    "Quero entrar com ação de {s} contra {n}, por onde começo?",
    "O processo {p} está concluso para despacho desde {m} de {y}. É normal?",
    "Paguei {v} de custas no {t}. Consigo reembolso?",
    "Minha mãe faleceu em {d} em {c}. Como abro o inventário?",
    "O que é tutela de urgência? Pedi em {d} e nada ainda.",
    "Tenho {k} dias para recorrer da decisão sobre {s}?",
    "Moro em {c} e o processo corre no {t}. Preciso viajar para a audiência?",
    "Oi, tudo bem? É sobre {s}.",
    "Como consulto processos em nome de {n}?",
    "A sentença de {d} condenou a ré a pagar {v}. Quando recebo?",
    "Meu processo {p} foi arquivado em {m} de {y}. Dá para desarquivar?",
    "Sou {n}, parte autora no {t}. Onde vejo as movimentações?",
    "Preciso de advogado para uma causa de {v} no juizado de {c}?",
)
_ANSWER = (
    "Olá, {n}! O processo {p} tramita no {t} e a última movimentação é de {d}.",
    "O prazo para contestar é de {k} dias úteis, contados da juntada do mandado de citação.",
    "Para a audiência em {c}, leve documento com foto, comprovante de residência e as provas de {s}.",
    "Sim, cabe recurso: a apelação tem prazo de quinze dias úteis a partir da intimação da sentença de {d}.",
    "Um processo de {s} em {c} costuma levar de {k} meses a dois anos, conforme a pauta da vara.",
    "Com valor de {v}, a causa pode correr no juizado especial, sem advogado até vinte salários mínimos.",
    "A intimação do {t} comunica um ato do processo; verifique o prazo indicado nela, em geral {k} dias.",
    "Você pode acompanhar as movimentações do processo {p} pelo site do {t} ou pelo Escavador.",
    "O inventário pode ser feito em cartório se todos os herdeiros forem maiores e concordarem com a partilha.",
    "A tutela de urgência é analisada com prioridade, mas o juiz pode pedir mais documentos antes de decidir.",
    "Concluso para despacho significa que os autos aguardam o juiz desde {m} de {y}; a espera varia por vara.",
    "Processos arquivados podem ser desarquivados mediante petição e, em alguns tribunais, pagamento de taxa.",
    "As custas de {v} só são devolvidas se a parte contrária for condenada a reembolsá-las na sentença.",
    "Não sou advogado, mas posso explicar como funciona a ação de {s} e quais documentos reunir.",
    "Se a outra parte não pagar os {v} no prazo, cabe pedir o cumprimento de sentença com multa de dez por cento.",
    "Em audiências virtuais do {t}, o link costuma ser enviado por e-mail alguns dias antes de {d}.",
    "Homônimos são comuns: confira o CPF das partes no processo {p} antes de se preocupar.",
    "Para {s}, reúna contracheques, extratos e mensagens que comprovem o que você alega.",
    "O vínculo sem carteira pode ser reconhecido na Justiça do Trabalho, com prazo de dois anos após a saída.",
    "A conciliação é obrigatória no juizado: a ausência do autor em {d} pode levar ao arquivamento.",
    "O recurso inominado tem prazo de dez dias úteis, contados da intimação.",
    "Obrigado pela pergunta, {n}! Posso te ajudar com mais alguma dúvida?",
    "Segundo o Código de Processo Civil, a petição inicial indica o juízo, as partes, os fatos e o pedido.",
    "Em {c}, a defensoria pública atende quem não pode pagar advogado; leve comprovante de renda.",
    "O valor de {v} será corrigido desde {d} e somado aos juros de mora até o pagamento.",
)

# Pool of common messages: Zipf-like weights over this many of each kind, filled once from the templates.
_POOL = 4096
_FRESH = 0.2   # share of sentences filled in afresh (distinct), the rest drawn from the pool
_BLOCK = 1 << 16  # rows (and sentences) drawn at a time


def _fill(templates: tuple, rng: np.random.Generator, n: int) -> list[str]:
    """``n`` messages from ``templates``, every slot filled from ``rng`` (vectorized choices)."""
    t = rng.integers(0, len(templates), n)
    first, last = rng.integers(0, len(_FIRST), n), rng.integers(0, len(_LAST), n)
    seq, dv, yr = rng.integers(0, 9_999_999, n), rng.integers(0, 100, n), rng.integers(2005, 2026, n)
    day, mon, year = rng.integers(1, 29, n), rng.integers(1, 13, n), rng.integers(2010, 2027, n)
    city, court, topic = (rng.integers(0, len(_CITY), n), rng.integers(0, len(_COURT), n),
                          rng.integers(0, len(_TOPIC), n))
    reais, cents, days = rng.integers(50, 250_000, n), rng.integers(0, 100, n), rng.integers(2, 61, n)
    cols = [a.tolist() for a in (t, first, last, seq, dv, yr, day, mon, year, city, court, topic, reais, cents,
                                 days)]   # (Python ints: numpy scalars format several times slower)
    return [templates[ti].format(
        n=f"{_FIRST[fi]} {_LAST[la]}", p=f"{sq:07d}-{d2:02d}.{yp}", d=f"{dd:02d}/{mm:02d}/{yy}", c=_CITY[ci],
        v=f"R$ {r // 1000}.{r % 1000:03d},{ce:02d}" if r >= 1000 else f"R$ {r},{ce:02d}", k=ds, t=_COURT[co],
        s=_TOPIC[to], m=_MONTH[mm - 1], y=yy)
        for ti, fi, la, sq, d2, yp, dd, mm, yy, ci, co, to, r, ce, ds in zip(*cols)]


class _Sentences:
    """An endless stream of sentences: from ``pool`` (Zipf-like weights) or, with probability
    :data:`_FRESH`, filled afresh from ``templates``; drawn ``batch`` at a time with numpy."""

    def __init__(self, rng: np.random.Generator, pool: list[str], templates: tuple, batch: int):
        self.rng, self.pool, self.templates, self.batch = rng, pool, templates, batch
        zipf = 1.0 / np.arange(1, len(pool) + 1)
        self.cdf = np.cumsum(zipf / zipf.sum())
        self.buf: list[str] = []
        self.at = 0

    def next(self) -> str:
        if self.at == len(self.buf):
            rng, pool = self.rng, self.pool
            fresh = rng.random(self.batch) < _FRESH
            picks = np.minimum(np.searchsorted(self.cdf, rng.random(self.batch)), len(pool) - 1)
            filled = iter(_fill(self.templates, rng, int(fresh.sum())))
            self.buf = [next(filled) if f else pool[p] for f, p in zip(fresh.tolist(), picks.tolist())]
            self.at = 0
        self.at += 1
        return self.buf[self.at - 1]

    def messages(self, n: int, lo: int, hi: int) -> list[str]:
        """``n`` messages of ``lo`` to ``hi`` characters: sentences joined until ``lo``, cut at ``hi``."""
        out = []
        for _ in range(n):
            text = self.next()
            while len(text) < lo:
                text += " " + self.next()
            out.append(text[:hi].rstrip())
        return out


def make_varied_chats(path: str | os.PathLike, n: int, *, seed: int = 0) -> str:
    """Write ``n`` seed-shaped ShareGPT conversations as varied as real chat data; return the path.

    The shape of :func:`vecpack.testing.make_short_chats` (the same system
    prompt, one exchange in 3 of 5 rows, two or three in the others, a user
    turn of up to 120 characters, an assistant turn of 100 to 440), filled as
    the module says: tens of thousands of distinct messages per 100k rows, with
    names, numbers and dates. Same ``n`` and ``seed``, same bytes.
    """
    rng = np.random.default_rng(seed)
    asks = _Sentences(rng, _fill(_ASK, rng, _POOL), _ASK, _BLOCK)
    answers = _Sentences(rng, _fill(_ANSWER, rng, _POOL), _ANSWER, _BLOCK)
    head = '{"conversations": [{"from": "system", "value": "' + SYSTEM + '"}'
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, _BLOCK):
            turns = rng.choice(np.array([1, 1, 1, 2, 3]), min(_BLOCK, n - start)).tolist()
            total = sum(turns)
            qs, rs = asks.messages(total, 4, 120), answers.messages(total, 100, 440)
            lines, j = [], 0
            for t in turns:
                parts = [head]
                for _ in range(t):
                    parts.append(', {"from": "human", "value": "' + qs[j] + '"}, {"from": "gpt", "value": "'
                                 + rs[j] + '"}')
                    j += 1
                parts.append("]}\n")
                lines.append("".join(parts))
            f.writelines(lines)
    return str(path)


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


_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER, _SP_BYTE = 1, 2, 3, 4, 6  # ModelProto.SentencePiece.Type

# The [INST] template of Mistral v1-v3 (system prompt on the first user turn); no spaces are written
# around contents: each text between two control tokens gets its own dummy-prefix "▁".
MISTRAL_SP_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = none %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system is not none %}{{- '[INST]' + system + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- else %}{{- message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

# Gemma's template (system prompt folded into the first user turn, "model" for the assistant).
GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set first = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return out, i


def _proto_fields(buf: bytes):
    """``(field number, wire type, value)`` of one protobuf message (values: int, bytes or raw float bytes)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:  # pragma: no cover - groups are not used by SentencePiece
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def sp_model_pieces(model_file: str | os.PathLike) -> list[tuple[str, float, int]]:
    """``(piece, score, type)`` of every piece of a SentencePiece ``.model`` file, in id order.

    A small reader of the model's protobuf (field 1, the pieces), so the
    fixtures need neither ``sentencepiece`` nor ``protobuf``.
    """
    import struct

    pieces = []
    for field, _, value in _proto_fields(pathlib.Path(model_file).read_bytes()):
        if field != 1:
            continue
        piece, score, kind = "", 0.0, _SP_NORMAL
        for f, _, v in _proto_fields(value):
            if f == 1:
                piece = v.decode("utf-8")
            elif f == 2:
                score = struct.unpack("<f", v)[0]
            elif f == 3:
                kind = v
        pieces.append((piece, score, kind))
    return pieces


def _mistral_model_file() -> pathlib.Path:
    import mistral_common

    return pathlib.Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"


def _sp_merges(pieces) -> list[tuple[str, str]]:
    """SentencePiece BPE as HF merges: every split of a normal piece into two normal pieces, by its score.

    SentencePiece merges the adjacent pair whose concatenation scores highest; ties (the whitespace
    runs ``"▁" * n``) go to the leftmost pair, which HF's (rank, position) order reproduces when
    longer left parts rank first.
    """
    normal = {p: (s, i) for i, (p, s, k) in enumerate(pieces) if k == _SP_NORMAL}
    ranked = []
    for piece, (score, pid) in normal.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in normal and right in normal:
                ranked.append((-score, -len(left), len(right), pid, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _write_sp(out: pathlib.Path, pieces, merges, normalizer, extra_added: list[str], config: dict) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {}
    for i, (p, _, _) in enumerate(pieces):
        vocab.setdefault(p, i)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tk.normalizer = normalizer
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = [p for p, _, k in pieces if k in (_SP_UNKNOWN, _SP_CONTROL)] + extra_added
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for t in specials:
        if t in vocab and tk.token_to_id(t) != vocab[t]:  # pragma: no cover - guards the fixture itself
            raise AssertionError(f"control piece {t!r} moved")
    out.mkdir(parents=True, exist_ok=True)
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def make_mistral_sp_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write Mistral v3's SentencePiece BPE (32,768 pieces, byte fallback) as an HF tokenizer.

    Built from the ``.model`` file that ``mistral-common`` ships, in
    SentencePiece's own order: the normalizer prepends ``"▁"`` to every text
    between two control tokens, then replaces ``" "`` by ``"▁"`` (the
    ``tokenizer.json`` of Mistral's and Llama 2's repositories); no
    pre-tokenizer. Control pieces (``<s>``, ``[INST]``...) are special tokens.
    """
    from tokenizers import normalizers

    pieces = sp_model_pieces(_mistral_model_file())
    out = pathlib.Path(out_dir)
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
              "chat_template": MISTRAL_SP_CHAT_TEMPLATE}
    _write_sp(out, pieces, _sp_merges(pieces), norm, [], config)
    return out


def make_gemma_like_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write a Gemma-like SentencePiece BPE: no dummy prefix, ``"\\n"`` pieces, Gemma's turn tokens.

    Mistral v3's pieces, plus ``"\\n"``, ``"\\n\\n"``, ``"\\t"`` as normal
    pieces (Gemma's vocabulary has them; Mistral's spells them in byte
    tokens), then ``<start_of_turn>`` / ``<end_of_turn>`` as special tokens;
    the normalizer only replaces ``" "`` by ``"▁"`` (Gemma adds no dummy
    prefix), byte fallback, Gemma's chat template.
    """
    from tokenizers import normalizers

    pieces = sp_model_pieces(_mistral_model_file())
    pieces = [*pieces, ("\n", 0.0, _SP_NORMAL), ("\n\n", 0.0, _SP_NORMAL), ("\t", 0.0, _SP_NORMAL)]
    merges = [("\n", "\n"), *_sp_merges(pieces[:-3])]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<end_of_turn>",
              "unk_token": "<unk>", "pad_token": "<unk>", "model_max_length": 8192,
              "clean_up_tokenization_spaces": False, "chat_template": GEMMA_CHAT_TEMPLATE}
    _write_sp(pathlib.Path(out_dir), pieces, merges, normalizers.Replace(" ", "▁"),
              ["<start_of_turn>", "<end_of_turn>"], config)
    return pathlib.Path(out_dir)
