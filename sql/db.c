/* Small SQLite helpers shared by the gateway's index and the worker's disk-tier inventory. */
#include "sql/db.h"

#include "cache/base.h"

void cg_db_log(const char *module, sqlite3 *db, const char *what)
{
    cg_log(CG_LOG_ERROR, "%s: %s: %s (%d)", module, what, sqlite3_errmsg(db),
           sqlite3_extended_errcode(db));
}

int cg_db_step_done(sqlite3_stmt *s)
{
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc;
}

cg_status cg_db_exec(const char *module, sqlite3 *db, const char *sql, const char *what)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        cg_log(CG_LOG_ERROR, "%s: %s: %s", module, what, err ? err : sqlite3_errmsg(db));
        sqlite3_free(err);
        return CG_E_IO;
    }
    return CG_OK;
}

cg_status cg_db_query_int(const char *module, sqlite3 *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    cg_status st = CG_E_IO;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) goto out;
    if (sqlite3_step(s) != SQLITE_ROW) goto out;
    *out = sqlite3_column_int64(s, 0);
    st = CG_OK;
out:
    if (st != CG_OK) cg_db_log(module, db, sql);
    sqlite3_finalize(s);
    return st;
}

void cg_db_bind_key(sqlite3_stmt *s, int i, const cg_key *k)
{
    sqlite3_bind_blob(s, i, k->b, sizeof k->b, SQLITE_STATIC);
}
