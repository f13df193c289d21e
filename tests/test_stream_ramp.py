"""The online packer's ramp: the first decision after RAMP documents, exact resume, old states without one."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

from resume_harness import check_resume, same  # noqa: E402
from test_streaming import make_ds  # noqa: E402
from test_streaming import small_file as small_file  # noqa: E402,F401 - the fixture, shared

import vecpack.streaming.run as run  # noqa: E402
from vecpack.packing.online import RAMP, BufferPacker  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def reference_packs(lengths, max_len: int, buffer_size: int, ramp: int) -> list:
    """The packer's rule in plain Python: wait for min(buffer_size, max(ramp, arrivals // 2)) entries
    (buffer_size without a ramp), then put the longest entry that fits the gap (oldest first)."""
    buf, out, open_, used = [], [], [], 0

    def cap(arrived):
        return buffer_size if not ramp or ramp >= buffer_size else min(buffer_size, max(ramp, arrived // 2))

    def step():
        nonlocal open_, used
        fits = [e for e in buf if e[1] <= max_len - used]
        if not fits:
            out.append(open_)
            open_, used = [], 0
            return
        best = max(fits, key=lambda e: (e[1], -e[0]))
        buf.remove(best)
        open_.append(best[0])
        used += best[1]
        if used == max_len:
            out.append(open_)
            open_, used = [], 0

    for i, n in enumerate(lengths):
        buf.append((i, int(n)))
        while len(buf) >= cap(i + 1):
            step()
    while buf:
        step()
    if open_:
        out.append(open_)
    return out


def packer_packs(lengths, max_len: int, buffer_size: int, ramp: int, stop: int | None = None) -> list:
    p = BufferPacker(max_len, buffer_size, ramp)
    packs = []
    for i, n in enumerate(lengths):
        if i == stop:  # a restore in a new packer, mid-way
            q = BufferPacker(max_len, buffer_size, ramp)
            q.restore([(h, n_, s) for h, n_, s in p.buffered], [(h, lengths[h]) for h in p.open_pack], p.next_seq)
            p = q
        p.add(i, int(n))
        while p.full:
            pack = p.step()
            if pack is not None:
                packs.append(pack)
    return packs + list(p.drain())


@pytest.mark.parametrize("buffer_size,ramp", [(200, 16), (200, 0), (10, 16), (50, 64)])
def test_packer_ramp_follows_the_rule_and_restores_exactly(buffer_size, ramp):
    lengths = np.random.default_rng(buffer_size + ramp).integers(1, 120, size=700)
    want = reference_packs(lengths, 128, buffer_size, ramp)
    assert packer_packs(lengths, 128, buffer_size, ramp) == want
    for stop in (5, 40, 333):
        assert packer_packs(lengths, 128, buffer_size, ramp, stop=stop) == want
    if ramp and ramp < buffer_size:   # the ramp changes decisions (else this test could not fail)
        assert want != reference_packs(lengths, 128, buffer_size, 0)
    with pytest.raises(ValueError, match="ramp must be >= 0"):
        BufferPacker(128, buffer_size, -1)


def test_first_pack_after_the_ramp_not_the_buffer(small_file):
    kw = dict(max_len=2048, buffer_size=150, seed=None)
    ds = make_ds(small_file, **kw)
    it = iter(ds)
    next(it)
    st = ds.state_dict()
    # one decision per document from the RAMP-th on: the pack's documents, plus an emit at most
    first = st["stats"]["num_entries"]
    assert RAMP <= st["stats"]["num_rows"] <= RAMP + first < 150 and st["config"]["ramp"] == RAMP
    # resume inside the ramp and after it: the rest equals the uninterrupted stream
    full = check_resume(lambda: make_ds(small_file, **kw), [1, 3, 12])
    assert len(full) > 12


def test_a_state_saved_before_the_ramp_resumes_without_one(small_file, monkeypatch):
    kw = dict(max_len=2048, buffer_size=150, seed=3)
    with_ramp = list(make_ds(small_file, **kw))
    monkeypatch.setattr(run, "RAMP", 0)
    full = list(make_ds(small_file, **kw))   # the stream as it was before the ramp
    assert not same(full, with_ramp)
    a = make_ds(small_file, **kw)
    it = iter(a)
    head = [next(it) for _ in range(2)]
    state = a.state_dict()
    del state["config"]["ramp"]               # an older vecpack's state
    monkeypatch.setattr(run, "RAMP", RAMP)
    b = make_ds(small_file, **kw)
    b.load_state_dict(state)
    assert same(head + list(b), full)
    assert b.state_dict()["config"]["ramp"] == 0
