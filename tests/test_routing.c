/* Unit suite of the gateway's routing rule (cg_route_pick in server/workers.c): least loaded
 * when nothing is cached, with a tie-break that rotates with the key; cached tokens win until
 * the load penalty outweighs them; a pinned holder wins over everything. */
#include <check.h>

#include "server/workers.h"
#include "tests/harness/harness.h"

START_TEST(route_rule)
{
    cg_route_kind k;
    ck_assert_int_eq(cg_route_pick(NULL, 0, 256, 50, 0, &k), -1);
    /* nothing cached: least loaded; equal load: the tie-break rotates with the key */
    cg_route_cand idle[3] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
    int seen[3] = {0, 0, 0};
    for (uint64_t t = 0; t < 3; t++) {
        int i = cg_route_pick(idle, 3, 256, 50, t, &k);
        ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
        seen[i]++;
    }
    ck_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    cg_route_cand load[3] = {{0, 3, 0, 0}, {0, 1, 0, 0}, {0, 2, 0, 0}};
    ck_assert_int_eq(cg_route_pick(load, 3, 256, 50, 0, &k), 1);
    /* cached tokens win... */
    cg_route_cand hit[3] = {{0, 0, 0, 0}, {500, 1, 0, 0}, {100, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(hit, 3, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    /* ...until the load penalty outweighs them */
    cg_route_cand busy[2] = {{0, 0, 0, 0}, {500, 2, 0, 0}};
    ck_assert_int_eq(cg_route_pick(busy, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
    ck_assert_int_eq(cg_route_pick(busy, 2, 100, 50, 0, &k), 1);
    /* a pinned holder wins over more cached tokens elsewhere */
    cg_route_cand pin[3] = {{50, 0, 1, 0}, {900, 0, 0, 0}, {0, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(pin, 3, 256, 50, 2, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_PINNED);
    /* shared remote tier: worth less than a local hit, more than a miss */
    cg_route_cand rem[2] = {{400, 0, 0, 0}, {0, 0, 0, 400}};
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 1, &k), 0); /* idle holder wins */
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    rem[0].in_flight = 1; /* 400 - 256 = 144 < 200: the idle worker fetches instead */
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 30, 0, &k), 0); /* 120 < 144 */
    cg_route_cand rem_vs_cold[2] = {{0, 0, 0, 0}, {0, 1, 0, 600}};
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 0, &k), 1); /* 300 - 256 > 0 */
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    rem_vs_cold[1].in_flight = 2;
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
}
END_TEST

int main(void)
{
    return th_run_tests("routing", "routing_rule", 0, TH_TESTS(route_rule));
}
