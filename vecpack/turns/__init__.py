"""Per-turn inference rows (``per_turn=True``): every trained assistant turn as the model sees it at inference.

::

    row (messages, tools, reasoning) ──encoder──► one document per trained assistant turn t_i:
        apply_chat_template(messages[:t_i + 1]), only turn t_i trained (its reasoning rendered)
        ──packed (one token trie per conversation; shared prefixes stored once)──► PackedTurns
        ──collate──► flat batch, position = depth, mask: i <= j < end[i] (flex or dense)

The modules, each imported on its own (this package imports nothing heavy):

* :mod:`vecpack.tokenizing.turns`: :func:`~vecpack.tokenizing.turns.turn_conversations`, the sink that expands rows.
* :mod:`vecpack.packing.turns`: :func:`~vecpack.packing.turns.plan_turns` -> ``PackedTurns``.
* :mod:`vecpack.integrations.collate`: :func:`~vecpack.integrations.collate.collate_turns`, its masks, ``model_inputs``.

See ``docs/agentic.md`` ("Per-turn inference rows").
"""
