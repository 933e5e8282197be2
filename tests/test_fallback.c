/* Unit suite of the fallback reasons (server/fallback.h): the wire names of
 * chunk_cache.fallback_reason, none for a request that did not fall back, and the series of
 * chunkgate_fallback_reasons_total with the help line the dashboards and docs quote. */
#include <check.h>
#include <string.h>

#include "base/base.h"
#include "server/fallback.h"
#include "tests/harness/harness.h"

START_TEST(fallback_table)
{
    ck_assert_ptr_null(cg_fallback_name(CG_FALLBACK_NONE));
    ck_assert_str_eq(cg_fallback_name(CG_FALLBACK_NO_WORKER), "no_worker");
    ck_assert_str_eq(cg_fallback_name(CG_FALLBACK_WORKER_ERROR), "worker_error");
    ck_assert_str_eq(cg_fallback_name(CG_FALLBACK_MODEL), "model");
    ck_assert_ptr_null(cg_fallback_name(CG_FALLBACK_COUNT));

    cg_metrics *m = cg_metrics_new();
    cg_metric *s[CG_FALLBACK_COUNT];
    cg_fallback_metrics(m, s);
    ck_assert_ptr_null(s[CG_FALLBACK_NONE]);
    cg_metric_add(s[CG_FALLBACK_MODEL], 2);
    cg_buf out;
    cg_buf_init_unbounded(&out);
    cg_metrics_render(m, &out);
    const char *text = out.data ? out.data : "";
    ck_assert_ptr_nonnull(
        strstr(text, "# HELP chunkgate_fallback_reasons_total Requests with cacheable segments "
                     "served without KV reuse, by reason: no_worker (none registered or "
                     "healthy), worker_error (assemble failed), model (the request names another "
                     "model than the workers serve).\n"));
    ck_assert_ptr_nonnull(strstr(text, "chunkgate_fallback_reasons_total{reason=\"no_worker\"} 0"));
    ck_assert_ptr_nonnull(
        strstr(text, "chunkgate_fallback_reasons_total{reason=\"worker_error\"} 0"));
    ck_assert_ptr_nonnull(strstr(text, "chunkgate_fallback_reasons_total{reason=\"model\"} 2"));
    /* registered in the table's order */
    const char *a = strstr(text, "reason=\"no_worker\""),
               *b = strstr(text, "reason=\"worker_error\""), *c = strstr(text, "reason=\"model\"");
    ck_assert(a < b && b < c);
    cg_buf_free(&out);
    cg_metrics_free(&m);
}
END_TEST

int main(void)
{
    return th_run_tests("fallback", "fallback_table", 0, TH_TESTS(fallback_table));
}
