/* The storage tiers a chunk's KV can sit in, generated from one table (DESIGN §8, §16): the
 * worker's RAM pool, its disk tier, and a shared remote tier on Redis. The wire name of each
 * (the worker's segment "tier", the gateway's index rows and /admin) is said here once. */
#ifndef CG_TIER_H
#define CG_TIER_H

/* X(enum, wire name). CG_TIER_REMOTE is held by a shared remote tier: in the gateway's index
 * its placements belong to the tier's own row (see cg_index_tier_row_url). */
#define CG_TIER_TABLE(X)                                                                           \
    X(CG_TIER_RAM, "ram")                                                                          \
    X(CG_TIER_DISK, "disk")                                                                        \
    X(CG_TIER_REMOTE, "remote")

typedef enum {
#define CG_TIER_ENUM(e, name) e,
    CG_TIER_TABLE(CG_TIER_ENUM)
#undef CG_TIER_ENUM
        CG_TIER_COUNT
} cg_tier;

/* What a segment served from no tier (computed) reports as its "tier" on the wire. */
#define CG_TIER_MISS_NAME "miss"

/* The tier's wire name ("ram", "disk", "remote"), or "unknown"; static storage. */
const char *cg_tier_name(cg_tier t);
/* A segment's wire "tier": cg_tier_name(t) for a hit, CG_TIER_MISS_NAME otherwise; static. */
const char *cg_tier_seg_name(int hit, cg_tier t);
/* Parses a tier's wire name into *out; returns 0 on success, -1 (*out untouched) if s is NULL
 * or names no tier. */
int cg_tier_parse(const char *s, cg_tier *out);

#endif
