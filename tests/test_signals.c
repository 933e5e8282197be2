/* The stop signals of both programs (base/signals.h): after cg_signals_block_stop a SIGTERM or
 * SIGINT sent to the process, from a thread started later or before the wait, neither kills it
 * nor runs a handler but is returned by cg_signals_wait_stop; a write to a closed pipe fails
 * with EPIPE instead of killing the process. Each test runs in its own forked process. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include "tests/harness/harness.h"
#include "base/base.h"
#include "base/signals.h"

static void *send_term(void *arg)
{
    th_sleep_ms(50);
    kill(getpid(), SIGTERM); /* to the process: any thread that does not block it would take it */
    return NULL;
}

START_TEST(stop_from_a_thread_is_waited_for)
{
    cg_signals_block_stop();
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, send_term, NULL), 0); /* inherits the mask */
    ck_assert_int_eq(cg_signals_wait_stop(), SIGTERM);
    pthread_join(th, NULL);
}
END_TEST

START_TEST(stop_before_the_wait_is_kept)
{
    cg_signals_block_stop();
    kill(getpid(), SIGINT);
    sigset_t pending;
    ck_assert_int_eq(sigpending(&pending), 0);
    ck_assert(sigismember(&pending, SIGINT));
    ck_assert_int_eq(cg_signals_wait_stop(), SIGINT);
    ck_assert_int_eq(sigpending(&pending), 0);
    ck_assert(!sigismember(&pending, SIGINT));
}
END_TEST

START_TEST(broken_pipe_is_an_error_not_a_signal)
{
    cg_signals_block_stop();
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    close(fd[0]);
    errno = 0;
    ck_assert_int_eq(write(fd[1], "x", 1), -1);
    ck_assert_int_eq(errno, EPIPE);
    close(fd[1]);
}
END_TEST

int main(void)
{
    cg_log_init("test_signals", CG_LOG_WARN);
    return th_run_suite("signals", "core", 30, (th_fixture){0}, CK_FORK,
                        TH_TESTS(stop_from_a_thread_is_waited_for, stop_before_the_wait_is_kept,
                                 broken_pipe_is_an_error_not_a_signal));
}
