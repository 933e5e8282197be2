/* Unit suite of the upstream failure kinds (server/failkind.h): the metric labels the
 * dashboards query, the reply a failure ends a request with, which kinds mark a worker down,
 * which are worker series, and the status-to-kind rule the gateway's call sites share. */
#include <check.h>

#include "server/failkind.h"
#include "tests/harness/harness.h"

START_TEST(failkind_table)
{
    /* the labels, in the order the series are registered */
    static const char *const labels[] = {"connect", "timeout",   "status",
                                         "invalid", "too_large", "stream"};
    ck_assert_int_eq(CG_FAILKIND_COUNT, sizeof labels / sizeof labels[0]);
    for (int k = 0; k < CG_FAILKIND_COUNT; k++)
        ck_assert_str_eq(cg_failkind_name((cg_failkind)k), labels[k]);
    ck_assert_str_eq(cg_failkind_name(CG_FAILKIND_COUNT), "unknown");
    /* only a failed connection or a timeout takes a worker out of routing */
    for (int k = 0; k < CG_FAILKIND_COUNT; k++)
        ck_assert_int_eq(cg_failkind_marks_down((cg_failkind)k),
                         k == CG_FAIL_CONNECT || k == CG_FAIL_TIMEOUT);
    /* a worker's answer is never cut for size: no worker series for too_large */
    for (int k = 0; k < CG_FAILKIND_COUNT; k++)
        ck_assert_int_eq(cg_failkind_of_worker((cg_failkind)k), k != CG_FAIL_TOO_LARGE);
    /* the replies: a timeout is 504, the rest 502; unreachable says so in its code */
    ck_assert_int_eq(cg_failkind_http(CG_FAIL_TIMEOUT), 504);
    ck_assert_int_eq(cg_failkind_status(CG_FAIL_TIMEOUT), CG_E_TIMEOUT);
    ck_assert_int_eq(cg_failkind_http(CG_FAIL_CONNECT), 502);
    ck_assert_int_eq(cg_failkind_status(CG_FAIL_CONNECT), CG_E_UNAVAILABLE);
    ck_assert_int_eq(cg_failkind_http(CG_FAIL_TOO_LARGE), 502);
    ck_assert_int_eq(cg_failkind_status(CG_FAIL_INVALID), CG_E_BAD_GATEWAY);
    ck_assert_int_eq(cg_failkind_status(CG_FAIL_STATUS), CG_E_BAD_GATEWAY);
    /* status to kind */
    ck_assert_int_eq(cg_failkind_of(CG_E_TIMEOUT, CG_FAIL_INVALID), CG_FAIL_TIMEOUT);
    ck_assert_int_eq(cg_failkind_of(CG_E_UNAVAILABLE, CG_FAIL_INVALID), CG_FAIL_CONNECT);
    ck_assert_int_eq(cg_failkind_of(CG_E_BAD_GATEWAY, CG_FAIL_INVALID), CG_FAIL_INVALID);
    ck_assert_int_eq(cg_failkind_of(CG_E_VALUE, CG_FAIL_STATUS), CG_FAIL_STATUS);
}
END_TEST

int main(void)
{
    return th_run_tests("failkind", "failkind_table", 0, TH_TESTS(failkind_table));
}
