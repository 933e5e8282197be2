/* The storage tiers' names, from the one table in base/tier.h. */
#include "base/tier.h"

#include <string.h>

static const char *const names[CG_TIER_COUNT] = {
#define CG_TIER_NAME(e, name) [e] = name,
    CG_TIER_TABLE(CG_TIER_NAME)
#undef CG_TIER_NAME
};

const char *cg_tier_name(cg_tier t)
{
    return (unsigned)t < CG_TIER_COUNT ? names[t] : "unknown";
}

const char *cg_tier_seg_name(int hit, cg_tier t)
{
    return hit ? cg_tier_name(t) : CG_TIER_MISS_NAME;
}

int cg_tier_parse(const char *s, cg_tier *out)
{
    for (unsigned i = 0; s && i < CG_TIER_COUNT; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (cg_tier)i;
            return 0;
        }
    }
    return -1;
}
