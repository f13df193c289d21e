"""The one log line a build writes on the ``"vecpack"`` logger: what was built, what came from the cache."""

from __future__ import annotations

import logging

__all__ = ["log_build", "log_mixture", "log_pairs"]

logger = logging.getLogger("vecpack")


def log_build(packed, corpus, pentry, store):
    seconds = packed.build_info.seconds
    stats = packed.stats
    what = (f"{stats.get('num_documents', '?'):,} documents in {len(packed):,} packs of "
            f"{packed.max_len} (fill {stats.get('fill', float('nan')):.3f})")
    tstats = corpus.stats
    if corpus.hit and tstats.get("rejected"):  # never let skipped rows go unreported
        examples = "; ".join(str(e) for e in (tstats.get("rejected_examples") or [])[:3])
        logger.warning("vecpack: %s of %s input rows were rejected when this corpus was built "
                       "(on_error='skip')%s", f"{tstats['rejected']:,}", f"{tstats.get('rows', '?'):,}",
                       f"; first: {examples}" if examples else "")
    if corpus.hit and not pentry.built:
        logger.info("vecpack: cache hit: %s loaded from %s (%s, built %s) in %.3f s", what,
                    pentry.path.parent, corpus.key, corpus.manifest.get("created"), seconds)
    elif corpus.hit:
        logger.info("vecpack: tokenized corpus from cache %s; re-packed into %s, stored as %s, in %.2f s",
                    corpus.path, what, pentry.path, seconds)
    else:
        logger.info("vecpack: built %s in %.2f s; cached in %s (%s, %s)", what, seconds,
                    store.root, corpus.key, pentry.key)


def log_mixture(packed, corpora, mentry):
    seconds = packed.build_info.seconds
    stats = packed.stats
    shares = ", ".join(f"{100 * s['share']:.1f}%" for s in stats["mixture"]["sources"])
    built = sum(not c.hit for c in corpora)
    logger.info("vecpack: mixture of %d sources (%s by %s) in %s packs of %d (fill %.3f): %s tokenized now, "
                "%s from the cache; plan %s, in %.2f s", len(corpora), shares, stats["mixture"]["mix_by"],
                f"{len(packed):,}", packed.max_len, stats.get("fill", float("nan")), built, len(corpora) - built,
                "from the cache" if not mentry.built else f"made now ({mentry.key})", seconds)


def log_pairs(packed, stats, corpus, pentry):
    logger.info("vecpack: %s preference pairs in %s packs of %s (fill %.3f)%s in %.2f s",
                f"{stats.get('num_pairs', 0):,}", f"{len(packed):,}", packed.max_len, stats.get("fill", 0.0),
                " from the cache" if corpus.hit and not pentry.built else "",
                packed.build_info.seconds)
