/* Check suite for the chunk event format (base/chunkevent.h): what the worker encodes decodes
 * to the same event; a missing or malformed field this version needs is refused; fields it does
 * not know are ignored. */
#include <check.h>
#include <string.h>

#include "base/chunkevent.h"
#include "tests/harness/harness.h"

static cg_chunkevent sample(void)
{
    cg_chunkevent ev = {.seq = 42,
                        .op = CG_CHUNKEVENT_EVICTED,
                        .tokens = 123,
                        .running = 3,
                        .queued = 7,
                        .ts_ms = 1795754189993ull,
                        .resync = 1};
    strcpy(ev.worker, "host-a:8090");
    strcpy(ev.epoch, "bb3117b13c60e24fe8d6c146617e65c1");
    strcpy(ev.key, "c969c74ddcbdadcdd4bd9313f22715f5");
    ev.tier = CG_TIER_DISK;
    return ev;
}

START_TEST(test_round_trip)
{
    for (int op = 0; op < CG_CHUNKEVENT_N_OPS; op++)
        for (int resync = 0; resync < 2; resync++) {
            cg_chunkevent ev = sample(), back;
            ev.op = (cg_chunkevent_op)op;
            ev.resync = resync;
            cg_chunkevent_wire w;
            cg_chunkevent_encode(&ev, &w);
            ck_assert_int_eq(w.argc % 2, 0);
            ck_assert_int_le(w.argc, 2 * CG_CHUNKEVENT_MAX_FIELDS);
            ck_assert_int_eq(cg_chunkevent_decode((size_t)w.argc, w.argv, w.lens, &back), CG_OK);
            ck_assert_str_eq(back.worker, ev.worker);
            ck_assert_str_eq(back.epoch, ev.epoch);
            ck_assert_uint_eq(back.seq, ev.seq);
            ck_assert_int_eq(back.op, ev.op);
            ck_assert_str_eq(back.key, ev.key);
            ck_assert_int_eq(back.tier, ev.tier);
            ck_assert_uint_eq(back.tokens, ev.tokens);
            ck_assert_uint_eq(back.running, ev.running);
            ck_assert_uint_eq(back.queued, ev.queued);
            ck_assert_uint_eq(back.ts_ms, ev.ts_ms);
            ck_assert_int_eq(back.resync, resync);
        }
    ck_assert_str_eq(cg_chunkevent_op_name(CG_CHUNKEVENT_SPILLED), "spilled");
    ck_assert_str_eq(cg_chunkevent_op_name(CG_CHUNKEVENT_N_OPS), "?");
}
END_TEST

/* Decodes the sample's fields with field i's value replaced by v (NULL: field i left out). */
static cg_status decode_with(int i, const char *v, cg_chunkevent *out)
{
    cg_chunkevent ev = sample();
    cg_chunkevent_wire w;
    cg_chunkevent_encode(&ev, &w);
    const char *f[2 * CG_CHUNKEVENT_MAX_FIELDS];
    size_t l[2 * CG_CHUNKEVENT_MAX_FIELDS], n = 0;
    for (int k = 0; k < w.argc; k += 2) {
        if (k / 2 == i && !v) continue;
        f[n] = w.argv[k];
        l[n++] = w.lens[k];
        f[n] = k / 2 == i ? v : w.argv[k + 1];
        l[n] = strlen(f[n]);
        n++;
    }
    return cg_chunkevent_decode(n, f, l, out);
}

START_TEST(test_refuses_bad_fields)
{
    cg_chunkevent out;
    /* fields in encode order: w e s op k t n run q ts r */
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(decode_with(i, NULL, &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(7, NULL, &out), CG_OK); /* run, q, ts, r are optional */
    ck_assert_int_eq(decode_with(2, "12x", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(2, "", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(2, "12345678901234567890", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(3, "moved", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(4, "c969c74d", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(6, "4294967296", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(5, "ramramram", &out), CG_E_VALUE);
    ck_assert_int_eq(decode_with(10, "0", &out), CG_OK);
    ck_assert_int_eq(out.resync, 0);
    /* an unknown field, as a newer worker may add, is ignored */
    const char *f[] = {
        "w", "a",   "e", "b", "s",  "1",  "op", "stored", "k", "c969c74ddcbdadcdd4bd9313f22715f5",
        "t", "ram", "n", "5", "zz", "new"};
    size_t l[16];
    for (int i = 0; i < 16; i++)
        l[i] = strlen(f[i]);
    ck_assert_int_eq(cg_chunkevent_decode(16, f, l, &out), CG_OK);
    ck_assert_int_eq(out.op, CG_CHUNKEVENT_STORED);
    ck_assert_uint_eq(out.tokens, 5);
}
END_TEST

int main(void)
{
    return th_run_tests("chunkevent", "format", 0,
                        TH_TESTS(test_round_trip, test_refuses_bad_fields));
}
