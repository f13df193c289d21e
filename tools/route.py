"""Trace the route of a call through vecpack's layers (issue 34's yardstick).

Runs ``vecpack.build`` on a small generated file with ``n_jobs=1`` and
``cache=True`` (a fresh cache), records every call into a vecpack function
(one *step*), and reports for the first ``--steps`` steps:

* the modules passed through;
* the *upward* steps: calls made from a lower layer into a higher one
  (the layers, top to bottom, are in :data:`LAYERS`);
* the functions on the path that take more than ``--max-params`` parameters.

    python tools/route.py            # the summary
    python tools/route.py --calls    # and every step
"""

from __future__ import annotations

import argparse
import sys
import tempfile

#: module prefix -> layer (0 = the front door; a larger number is further down the route)
LAYERS = [
    ("vecpack.pipeline.build", 0), ("vecpack.pipeline.route", 0), ("vecpack.pipeline.info", 0),
    ("vecpack.pipeline.logs", 0),
    ("vecpack.streaming.dataset", 0), ("vecpack.torchtune", 0),
    ("vecpack.cli", 0),
    ("vecpack.request", 1), ("vecpack.options", 1),
    ("vecpack.inputs.sources", 2), ("vecpack.mixing.source", 2), ("vecpack.store.fingerprint", 2),
    ("vecpack.store.hashing", 2),
    ("vecpack.inputs", 3), ("vecpack.tokenizing", 3), ("vecpack.chat", 3), ("vecpack.tokenizing.pairs", 3),
    ("vecpack.chat.pairs", 3),
    ("vecpack.pipeline.planners", 4), ("vecpack.mixing", 4), ("vecpack.packing.plan", 4),
    ("vecpack.packing.pairs", 4),
    ("vecpack.packing", 5),
    ("vecpack.store", 6),
]
#: shared by every layer (process state, errors, the lazy public names): not on the route
NEUTRAL = ("vecpack._state", "vecpack.errors", "vecpack")


def layer(module: str) -> int | None:
    if module in NEUTRAL:
        return None
    for prefix, n in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return n
    return 1


def trace(fn, steps: int):
    """Run ``fn()``, returning the first ``steps`` vecpack calls as (caller, callee, code) tuples."""
    calls = []

    def profiler(frame, event, arg):
        if event != "call" or len(calls) >= steps:
            return
        mod = frame.f_globals.get("__name__", "")
        if not mod.startswith("vecpack") or frame.f_code.co_name.startswith("<"):
            return
        back = frame.f_back
        while back is not None and not back.f_globals.get("__name__", "").startswith("vecpack"):
            back = back.f_back
        caller = back.f_globals["__name__"] if back is not None else "<user>"
        calls.append((caller, mod, frame.f_code))

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def n_params(code) -> int:
    n = code.co_argcount + code.co_kwonlyargcount
    return n - (1 if code.co_varnames[:1] in (("self",), ("cls",)) else 0)


def route_of_build(steps: int = 400, glob: bool = True):
    import vecpack
    from vecpack.testing import cached_tokenizer_dir, make_sharegpt

    tok = cached_tokenizer_dir("qwen2.5")
    with tempfile.TemporaryDirectory() as d:
        data = make_sharegpt(d + "/chat.jsonl", 40)
        vecpack.build(data, tok, 1024, cache_dir=d + "/warm", n_jobs=1, progress=False)  # imports, memos
        return trace(lambda: vecpack.build(d + "/*.jsonl" if glob else data, tok, 1024, cache_dir=d + "/cache",
                                           n_jobs=1, progress=False), steps)


def summary(calls, max_params: int = 8) -> dict:
    up = [(a, b, c) for a, b, c in calls
          if a != "<user>" and None not in (layer(a), layer(b)) and layer(b) < layer(a)]
    # (a dataclass's generated __init__, "<string>", is a record's constructor, not a step of the route)
    wide = sorted({f"{c.co_filename.split('vecpack/')[-1]}:{c.co_name} ({n_params(c)})"
                   for _, _, c in calls if n_params(c) > max_params and c.co_filename != "<string>"})
    return {"steps": len(calls), "modules": len({b for _, b, _ in calls}), "upward": up, "wide": wide}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--max-params", type=int, default=8)
    ap.add_argument("--calls", action="store_true")
    args = ap.parse_args(argv)
    everything = route_of_build(10**6)
    calls = everything[:args.steps]
    s = summary(calls, args.max_params)
    if args.calls:
        for a, b, c in calls:
            print(f"{layer(a)}>{layer(b)} {a} -> {b}.{c.co_name}")
    print(f"{s['steps']} steps through {s['modules']} modules; {len(s['upward'])} upward:")
    for a, b, c in s["upward"]:
        print(f"  {a} (layer {layer(a)}) -> {b}.{c.co_name} (layer {layer(b)})")
    names = [c.co_name for _, _, c in everything]
    print(f"in the whole call ({len(everything)} steps): resolve_sources {names.count('resolve_sources')}x, "
          f"is_mixture {names.count('is_mixture')}x")
    print(f"functions taking more than {args.max_params} parameters: {len(s['wide'])}")
    for w in s["wide"]:
        print("  " + w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
