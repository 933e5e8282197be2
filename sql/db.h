/* Small SQLite helpers shared by the gateway's index and the worker's disk-tier inventory. */
#ifndef CG_DB_H
#define CG_DB_H

#include <stdint.h>
#include <sqlite3.h>
#include "cache/key.h"
#include "base/status.h"

/* Logs an SQLite error of db as "<module>: <what>: <message> (<extended code>)". */
void cg_db_log(const char *module, sqlite3 *db, const char *what);
/* Opens path into *db for one thread at a time (SQLITE_OPEN_NOMUTEX added to flags, which say
 * SQLITE_OPEN_READWRITE, with SQLITE_OPEN_CREATE where the file may be new), with extended
 * result codes and a busy timeout of busy_ms. Otherwise CG_E_IO, logged as "<module>: cannot
 * open <path>: <why>", and *db NULL. The caller closes *db. */
cg_status cg_db_open(const char *module, const char *path, int flags, int busy_ms,
                     sqlite3 **db) CG_WUR;
/* Prepares sql[0..n) into out[0..n) (SQLITE_PREPARE_PERSISTENT: statements kept for the life of
 * the connection). CG_E_IO, logged with the failing statement, at the first that fails; the
 * ones prepared stay in out for cg_db_finalize_all. */
cg_status cg_db_prepare_all(const char *module, sqlite3 *db, const char *const *sql,
                            sqlite3_stmt **out, int n) CG_WUR;
/* Finalizes s[0..n) (NULL entries are fine) and sets them to NULL. */
void cg_db_finalize_all(sqlite3_stmt **s, int n);
/* Steps s to completion (ignoring rows), then resets it and clears its bindings.
 * Returns the final step code (SQLITE_DONE on success). */
int cg_db_step_done(sqlite3_stmt *s);
/* sqlite3_exec of sql; on failure logs "<module>: <what>: ..." and returns CG_E_IO. */
/* Not CG_WUR: a failed ROLLBACK is logged here and has nothing left to undo. */
cg_status cg_db_exec(const char *module, sqlite3 *db, const char *sql, const char *what);
/* Runs a one-row integer query (a PRAGMA, a count) into *out; CG_E_IO (logged) otherwise. */
cg_status cg_db_query_int(const char *module, sqlite3 *db, const char *sql, int64_t *out) CG_WUR;
/* Switches db to WAL journal mode (persistent in the file) and checks that SQLite did: it keeps
 * the old mode without an error where WAL is impossible (an in-memory database, a file system
 * without shared memory). Returns CG_OK, or CG_E_IO, logged as "<module>: <path>: cannot
 * switch to WAL mode". Every opener of our files calls this, so the choice is made once. */
cg_status cg_db_use_wal(const char *module, sqlite3 *db, const char *path) CG_WUR;
/* Binds the 16 key bytes to parameter i; the key must outlive the statement's next step. */
void cg_db_bind_key(sqlite3_stmt *s, int i, const cg_key *k);

/* A versioned schema: PRAGMA application_id marks the file as ours, PRAGMA user_version holds
 * the number of migrations applied. */
typedef struct cg_db_schema {
    const char *module;            /* log prefix, e.g. "index" */
    const char *kind;              /* what the file is, e.g. "a chunkgate index" */
    const char *upgrade_hint;      /* what to do about a file newer than this build */
    int app_id;                    /* PRAGMA application_id of our files */
    int version;                   /* the latest version this build knows */
    const char *const *migrations; /* migrations[v] takes version v to v + 1 */
} cg_db_schema;

/* Reads the file's version into *version. Refuses (CG_E_UNSUPPORTED, logged) a file of another
 * application, an SQLite file that is not ours, or a version newer than schema->version;
 * CG_E_IO when the file cannot be read. Changes nothing. */
cg_status cg_db_check_version(sqlite3 *db, const char *path, const cg_db_schema *schema,
                              int64_t *version) CG_WUR;
/* Applies the pending migrations, each with its user_version bump in one BEGIN IMMEDIATE
 * transaction, so a crash leaves the old or the new version, never a mix. */
cg_status cg_db_migrate(sqlite3 *db, const char *path, const cg_db_schema *schema) CG_WUR;
/* Makes an open file ready for schema, in the order every opener of our files needs: refuses a
 * future or foreign file before changing anything in it (cg_db_check_version), switches it to
 * WAL (cg_db_use_wal), runs pragmas (the opener's durability settings: synchronous, journal
 * size limit), then migrates (cg_db_migrate). Returns their status, CG_E_IO for the pragmas. */
cg_status cg_db_setup(sqlite3 *db, const char *path, const cg_db_schema *schema,
                      const char *pragmas) CG_WUR;
/* 1 when the SQLite file at path is damaged: SQLite finds it is not a database or corrupt, or
 * PRAGMA quick_check reports a problem. 0 when it reads as sound, and when it cannot be read at
 * all (missing, no permission): only a file SQLite can read and finds broken counts. */
int cg_db_file_damaged(const char *path);

#endif
