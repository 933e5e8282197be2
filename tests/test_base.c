/* The process-wide basics of base/base.h: a cg_buf holds exactly up to its cap and refuses the
 * byte past it, by append and by printf alike, without changing what it holds; an unbounded
 * buffer grows but refuses a size that would wrap; a zero cap is a programming error (an
 * assertion, or a buffer that holds nothing where assertions are off), never "unlimited".
 * A timed wait on a monotonic condition variable with a cg_deadline_after_ms deadline lasts
 * the time asked: a deadline on the wrong clock would end it at once. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/harness/harness.h"
#include "base/base.h"

START_TEST(buf_holds_up_to_its_cap)
{
    cg_buf b;
    cg_buf_init(&b, 8);
    ck_assert_int_eq(cg_buf_append(&b, "hello", 5), CG_OK);
    ck_assert_int_eq(cg_buf_append(&b, "abc", 3), CG_OK); /* exactly the cap */
    ck_assert_int_eq(cg_buf_append(&b, "x", 1), CG_E_TOO_LARGE);
    ck_assert_int_eq(cg_buf_printf(&b, "%d", 1), CG_E_TOO_LARGE);
    ck_assert_int_eq(cg_buf_append(&b, "", 0), CG_OK);
    ck_assert_uint_eq(b.len, 8);
    ck_assert_str_eq(b.data, "helloabc"); /* a refused append changes nothing */
    cg_buf_reset(&b);
    ck_assert_int_eq(cg_buf_printf(&b, "%s-%d", "abcd", 123), CG_OK);
    ck_assert_int_eq(cg_buf_printf(&b, "%d", 12), CG_E_TOO_LARGE); /* 8 + 2 > 8 */
    ck_assert_str_eq(b.data, "abcd-123");
    cg_buf_free(&b);
    ck_assert_ptr_null(b.data);
}
END_TEST

START_TEST(unbounded_buf_grows_but_never_wraps)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    char piece[4096];
    memset(piece, 'a', sizeof piece);
    for (int i = 0; i < 1024; i++)
        ck_assert_int_eq(cg_buf_append(&b, piece, sizeof piece), CG_OK);
    ck_assert_uint_eq(b.len, 4u << 20);
    ck_assert_int_eq(b.data[b.len], '\0');
    /* len + n + 1 would wrap: refused before any copy or allocation */
    ck_assert_int_eq(cg_buf_append(&b, piece, SIZE_MAX - b.len), CG_E_TOO_LARGE);
    ck_assert_int_eq(cg_buf_append(&b, piece, SIZE_MAX), CG_E_TOO_LARGE);
    ck_assert_uint_eq(b.len, 4u << 20);
    cg_buf_free(&b);
}
END_TEST

START_TEST(zero_cap_is_never_unlimited)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        cg_buf b;
        cg_buf_init(&b, 0); /* asserts; without assertions it holds nothing */
        cg_status st = cg_buf_append(&b, "x", 1);
        _exit(st == CG_E_TOO_LARGE && b.len == 0 ? 42 : 1);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg((WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT) ||
                      (WIFEXITED(ws) && WEXITSTATUS(ws) == 42),
                  "a zero cap took a byte (wait status %#x)", ws);
}
END_TEST

START_TEST(monotonic_deadline_waits_the_time_asked)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    cg_cond_init_monotonic(&cv);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    struct timespec until = cg_deadline_after_ms(150);
    int64_t ahead_ms = (int64_t)(until.tv_sec - now.tv_sec) * 1000 +
                       (int64_t)(until.tv_nsec - now.tv_nsec) / 1000000;
    ck_assert_msg(ahead_ms >= 149 && ahead_ms <= 1150, "deadline %lld ms ahead of CLOCK_MONOTONIC",
                  (long long)ahead_ms);
    uint64_t t0 = cg_now_ms();
    pthread_mutex_lock(&mu);
    int rc;
    do
        rc = pthread_cond_timedwait(&cv, &mu, &until);
    while (rc == 0); /* spurious wakeups */
    pthread_mutex_unlock(&mu);
    uint64_t waited = cg_now_ms() - t0;
    ck_assert_int_eq(rc, ETIMEDOUT);
    ck_assert_msg(waited >= 140 && waited < 5000, "waited %llu ms for 150",
                  (unsigned long long)waited);
    pthread_cond_destroy(&cv);
}
END_TEST

int main(void)
{
    return th_run_tests("base", "core", 60,
                        TH_TESTS(buf_holds_up_to_its_cap, unbounded_buf_grows_but_never_wraps,
                                 zero_cap_is_never_unlimited,
                                 monotonic_deadline_waits_the_time_asked));
}
