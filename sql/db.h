/* Small SQLite helpers shared by the gateway's index and the worker's disk-tier inventory. */
#ifndef CG_DB_H
#define CG_DB_H

#include <stdint.h>
#include <sqlite3.h>
#include "cache/key.h"
#include "cache/status.h"

/* Logs an SQLite error of db as "<module>: <what>: <message> (<extended code>)". */
void cg_db_log(const char *module, sqlite3 *db, const char *what);
/* Steps s to completion (ignoring rows), then resets it and clears its bindings.
 * Returns the final step code (SQLITE_DONE on success). */
int cg_db_step_done(sqlite3_stmt *s);
/* sqlite3_exec of sql; on failure logs "<module>: <what>: ..." and returns CG_E_IO. */
/* Not CG_WUR: a failed ROLLBACK is logged here and has nothing left to undo. */
cg_status cg_db_exec(const char *module, sqlite3 *db, const char *sql, const char *what);
/* Runs a one-row integer query (a PRAGMA, a count) into *out; CG_E_IO (logged) otherwise. */
cg_status cg_db_query_int(const char *module, sqlite3 *db, const char *sql, int64_t *out) CG_WUR;
/* Binds the 16 key bytes to parameter i; the key must outlive the statement's next step. */
void cg_db_bind_key(sqlite3_stmt *s, int i, const cg_key *k);

#endif
