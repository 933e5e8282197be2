/* The stop signals of the two programs (see signals.h): blocked everywhere, taken in main. */
#include "base/signals.h"

#include <pthread.h>
#include <signal.h>

#include "base/base.h"

static void stop_set(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
}

void cg_signals_block_stop(void)
{
    sigset_t stop;
    stop_set(&stop);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int cg_signals_wait_stop(void)
{
    sigset_t stop;
    stop_set(&stop);
    int sig = 0;
    sigwait(&stop, &sig); /* fails only for an invalid set */
    cg_log(CG_LOG_INFO, "received %s; stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return sig;
}
