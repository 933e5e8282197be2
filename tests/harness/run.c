/* Test harness: building and running Check suites from lists of tests. */
#include "tests/harness/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TCase *th_case(Suite *s, const char *name, double timeout_s, const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    if (timeout_s > 0) tcase_set_timeout(tc, timeout_s);
    for (; *tests; tests++)
        tcase_add_test(tc, *tests);
    suite_add_tcase(s, tc);
    return tc;
}

int th_run(Suite *s, enum fork_status mode)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, mode); /* CK_FORK_GETENV: the CK_FORK variable decides */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    int ran = srunner_ntests_run(sr);
    srunner_free(sr);
    /* A run that checked nothing (CK_RUN_SUITE or CK_RUN_CASE naming no case, a suite left
     * empty) proves nothing: it fails rather than pass unseen. */
    if (ran == 0) fprintf(stderr, "no test ran: CK_RUN_SUITE / CK_RUN_CASE match no case\n");
    return failed || th_failures || ran == 0 ? 1 : 0;
}

int th_run_suite(const char *suite, const char *tcase, double timeout_s, th_fixture fx,
                 enum fork_status mode, const TTest *const *tests)
{
    Suite *s = suite_create(suite);
    TCase *tc = th_case(s, tcase, timeout_s, tests);
    if (fx.setup || fx.teardown) {
        if (fx.each)
            tcase_add_checked_fixture(tc, fx.setup, fx.teardown);
        else
            tcase_add_unchecked_fixture(tc, fx.setup, fx.teardown);
    }
    return th_run(s, mode);
}

int th_run_tests(const char *suite, const char *tcase, double timeout_s, const TTest *const *tests)
{
    return th_run_suite(suite, tcase, timeout_s, (th_fixture){0}, CK_FORK_GETENV, tests);
}

int th_parse_opts(int argc, char **argv, const th_opt *opts, size_t n)
{
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const th_opt *o = NULL;
        for (size_t k = 0; k < n && !o; k++)
            if (!strcmp(argv[i], opts[k].name)) o = &opts[k];
        if (o && o->type == TH_OPT_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        if (i + 1 >= argc) return -1;
        const char *v = argv[++i];
        if (!o) {
            rc = -1;
            continue;
        }
        switch (o->type) {
        case TH_OPT_INT:
            *(int *)o->dst = atoi(v);
            break;
        case TH_OPT_LONG:
            *(long *)o->dst = atol(v);
            break;
        case TH_OPT_SIZE:
            *(size_t *)o->dst = (size_t)atol(v);
            break;
        case TH_OPT_DOUBLE:
            *(double *)o->dst = atof(v);
            break;
        default:
            *(const char **)o->dst = v;
        }
    }
    return rc;
}
