/* The chunk event's stream fields, both ways (base/chunkevent.h). */
#include "base/chunkevent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = {
#define CG_CHUNKEVENT_NAME(e, name, help) name,
    CG_CHUNKEVENT_OPS(CG_CHUNKEVENT_NAME)
#undef CG_CHUNKEVENT_NAME
};

const char *cg_chunkevent_op_name(cg_chunkevent_op op)
{
    return (unsigned)op < CG_CHUNKEVENT_N_OPS ? op_names[op] : "?";
}

static void put(cg_chunkevent_wire *w, const char *field, const char *val, size_t len)
{
    w->argv[w->argc] = field;
    w->lens[w->argc++] = strlen(field);
    w->argv[w->argc] = val;
    w->lens[w->argc++] = len;
}

static void put_num(cg_chunkevent_wire *w, int slot, const char *field, uint64_t v)
{
    int k = snprintf(w->num[slot], sizeof w->num[slot], "%llu", (unsigned long long)v);
    put(w, field, w->num[slot], (size_t)k);
}

void cg_chunkevent_encode(const cg_chunkevent *ev, cg_chunkevent_wire *w)
{
    w->argc = 0;
    const char *op = cg_chunkevent_op_name(ev->op);
    put(w, "w", ev->worker, strlen(ev->worker));
    put(w, "e", ev->epoch, strlen(ev->epoch));
    put_num(w, 0, "s", ev->seq);
    put(w, "op", op, strlen(op));
    put(w, "k", ev->key, strlen(ev->key));
    const char *tier = cg_tier_name(ev->tier);
    put(w, "t", tier, strlen(tier));
    put_num(w, 1, "n", ev->tokens);
    put_num(w, 2, "run", ev->running);
    put_num(w, 3, "q", ev->queued);
    put_num(w, 4, "ts", ev->ts_ms);
    if (ev->resync) put(w, "r", "1", 1);
}

/* Parses a decimal of at most 19 digits; 0 on success. */
static int parse_u64(const char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Copies a string field into dst (cap bytes with the NUL); 0 on success. */
static int copy_str(char *dst, size_t cap, const char *s, size_t len)
{
    if (len == 0 || len >= cap || memchr(s, 0, len)) return -1;
    memcpy(dst, s, len);
    dst[len] = 0;
    return 0;
}

cg_status cg_chunkevent_decode(size_t n, const char *const *fields, const size_t *lens,
                               cg_chunkevent *out)
{
    memset(out, 0, sizeof *out);
    enum { W = 1, E = 2, S = 4, OP = 8, K = 16, T = 32, N = 64 };
    unsigned have = 0;
    int bad = 0;
    for (size_t i = 0; i + 1 < n; i += 2) {
        const char *f = fields[i], *v = fields[i + 1];
        size_t fl = lens[i], vl = lens[i + 1];
        uint64_t x = 0;
#define FIELD(name) (fl == sizeof(name) - 1 && !memcmp(f, name, fl))
        if (FIELD("w")) {
            bad |= copy_str(out->worker, sizeof out->worker, v, vl);
            have |= W;
        } else if (FIELD("e")) {
            bad |= copy_str(out->epoch, sizeof out->epoch, v, vl);
            have |= E;
        } else if (FIELD("s")) {
            bad |= parse_u64(v, vl, &out->seq);
            have |= S;
        } else if (FIELD("op")) {
            out->op = CG_CHUNKEVENT_N_OPS;
            for (int o = 0; o < CG_CHUNKEVENT_N_OPS; o++)
                if (strlen(op_names[o]) == vl && !memcmp(op_names[o], v, vl))
                    out->op = (cg_chunkevent_op)o;
            bad |= out->op == CG_CHUNKEVENT_N_OPS;
            have |= OP;
        } else if (FIELD("k")) {
            bad |= vl != 32 || copy_str(out->key, sizeof out->key, v, vl);
            have |= K;
        } else if (FIELD("t")) {
            char t[8];
            bad |= copy_str(t, sizeof t, v, vl) || cg_tier_parse(t, &out->tier) != 0;
            have |= T;
        } else if (FIELD("n")) {
            bad |= parse_u64(v, vl, &x) || x > UINT32_MAX;
            out->tokens = (uint32_t)x;
            have |= N;
        } else if (FIELD("run")) {
            bad |= parse_u64(v, vl, &x) || x > UINT32_MAX;
            out->running = (uint32_t)x;
        } else if (FIELD("q")) {
            bad |= parse_u64(v, vl, &x) || x > UINT32_MAX;
            out->queued = (uint32_t)x;
        } else if (FIELD("ts")) {
            bad |= parse_u64(v, vl, &out->ts_ms);
        } else if (FIELD("r")) {
            out->resync = vl == 1 && v[0] == '1';
        }
#undef FIELD
    }
    if (bad || have != (W | E | S | OP | K | T | N)) return CG_E_VALUE;
    return CG_OK;
}
