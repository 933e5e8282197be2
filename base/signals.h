/* How the two programs, chunkgate and chunkgate-worker, take their stop signals: SIGINT and
 * SIGTERM are blocked in every thread and taken by sigwait in main, so no handler ever runs in
 * an arbitrary thread; SIGPIPE is ignored, a write to a peer that left fails where it is made. */
#ifndef CG_SIGNALS_H
#define CG_SIGNALS_H

/* Blocks SIGINT and SIGTERM in the calling thread and ignores SIGPIPE. Call in main before any
 * thread starts: threads inherit the mask, so none of them is ever interrupted by a stop. */
void cg_signals_block_stop(void);
/* Waits for SIGINT or SIGTERM (blocked by cg_signals_block_stop), logs "received <name>;
 * stopping" and returns the signal. A stop sent before the call is taken at once. */
int cg_signals_wait_stop(void);

#endif
