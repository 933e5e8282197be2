/* Small SQLite helpers shared by the gateway's index and the worker's disk-tier inventory. */
#include "sql/db.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"

void cg_db_log(const char *module, sqlite3 *db, const char *what)
{
    cg_log(CG_LOG_ERROR, "%s: %s: %s (%d)", module, what, sqlite3_errmsg(db),
           sqlite3_extended_errcode(db));
}

cg_status cg_db_open(const char *module, const char *path, int flags, int busy_ms, sqlite3 **db)
{
    if (sqlite3_open_v2(path, db, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        cg_log(CG_LOG_ERROR, "%s: cannot open %s: %s", module, path,
               *db ? sqlite3_errmsg(*db) : "out of memory");
        sqlite3_close(*db);
        *db = NULL;
        return CG_E_IO;
    }
    sqlite3_extended_result_codes(*db, 1);
    sqlite3_busy_timeout(*db, busy_ms);
    return CG_OK;
}

cg_status cg_db_prepare_all(const char *module, sqlite3 *db, const char *const *sql,
                            sqlite3_stmt **out, int n)
{
    for (int i = 0; i < n; i++) {
        if (sqlite3_prepare_v3(db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &out[i], NULL) !=
            SQLITE_OK) {
            cg_db_log(module, db, sql[i]);
            return CG_E_IO;
        }
    }
    return CG_OK;
}

void cg_db_finalize_all(sqlite3_stmt **s, int n)
{
    for (int i = 0; i < n; i++) {
        sqlite3_finalize(s[i]);
        s[i] = NULL;
    }
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

cg_status cg_db_use_wal(const char *module, sqlite3 *db, const char *path)
{
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &s, NULL) == SQLITE_OK &&
             sqlite3_step(s) == SQLITE_ROW &&
             strcmp((const char *)sqlite3_column_text(s, 0), "wal") == 0;
    sqlite3_finalize(s);
    if (ok) return CG_OK;
    cg_log(CG_LOG_ERROR, "%s: %s: cannot switch to WAL mode", module, path);
    return CG_E_IO;
}

void cg_db_bind_key(sqlite3_stmt *s, int i, const cg_key *k)
{
    sqlite3_bind_blob(s, i, k->b, sizeof k->b, SQLITE_STATIC);
}

cg_status cg_db_check_version(sqlite3 *db, const char *path, const cg_db_schema *schema,
                              int64_t *version)
{
    const char *m = schema->module;
    int64_t app = 0, tables = 0;
    if (cg_db_query_int(m, db, "PRAGMA application_id", &app) != CG_OK ||
        cg_db_query_int(m, db, "PRAGMA user_version", version) != CG_OK ||
        cg_db_query_int(m, db, "SELECT count(*) FROM sqlite_schema", &tables) != CG_OK)
        return CG_E_IO;
    if (app != 0 && app != schema->app_id) {
        cg_log(CG_LOG_ERROR, "%s: %s is an SQLite file of another application (id %lld)", m, path,
               (long long)app);
        return CG_E_UNSUPPORTED;
    }
    if (app == 0 && (*version != 0 || tables != 0)) {
        cg_log(CG_LOG_ERROR, "%s: %s is an SQLite file but not %s", m, path, schema->kind);
        return CG_E_UNSUPPORTED;
    }
    if (*version > schema->version) {
        cg_log(CG_LOG_ERROR,
               "%s: %s has schema version %lld but this build knows versions up to %d; %s", m, path,
               (long long)*version, schema->version, schema->upgrade_hint);
        return CG_E_UNSUPPORTED;
    }
    return CG_OK;
}

cg_status cg_db_migrate(sqlite3 *db, const char *path, const cg_db_schema *schema)
{
    const char *m = schema->module;
    for (;;) {
        int64_t v = 0;
        cg_status st = cg_db_check_version(db, path, schema, &v);
        if (st != CG_OK) return st;
        if (v == schema->version) return CG_OK;
        if (cg_db_exec(m, db, "BEGIN IMMEDIATE", "begin migration") != CG_OK) return CG_E_IO;
        /* Re-read inside the write lock: another process may have migrated meanwhile. */
        st = cg_db_check_version(db, path, schema, &v);
        if (st == CG_OK && v < schema->version) {
            char sql[96];
            snprintf(sql, sizeof sql, "PRAGMA user_version = %lld; PRAGMA application_id = %d;",
                     (long long)(v + 1), schema->app_id);
            st = cg_db_exec(m, db, schema->migrations[v], "migration");
            if (st == CG_OK) st = cg_db_exec(m, db, sql, "set user_version");
            if (st == CG_OK) st = cg_db_exec(m, db, "COMMIT", "commit migration");
            if (st == CG_OK)
                cg_log(CG_LOG_INFO, "%s: %s migrated to schema version %lld", m, path,
                       (long long)(v + 1));
        }
        if (st != CG_OK) {
            if (!sqlite3_get_autocommit(db))
                (void)cg_db_exec(m, db, "ROLLBACK", "rollback migration");
            return st;
        }
        if (!sqlite3_get_autocommit(db) && cg_db_exec(m, db, "COMMIT", "end migration") != CG_OK)
            return CG_E_IO;
    }
}

cg_status cg_db_setup(sqlite3 *db, const char *path, const cg_db_schema *schema,
                      const char *pragmas)
{
    const char *m = schema->module;
    cg_status st = cg_db_check_version(db, path, schema, &(int64_t){0});
    if (st != CG_OK) return st;
    if (cg_db_use_wal(m, db, path) != CG_OK || cg_db_exec(m, db, pragmas, "configure") != CG_OK)
        return CG_E_IO;
    return cg_db_migrate(db, path, schema);
}

int cg_db_file_damaged(const char *path)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return 0;
    }
    sqlite3_stmt *s = NULL;
    int damaged = 0;
    int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &s, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        damaged = !r || strcmp(r, "ok") != 0;
    } else {
        int e = sqlite3_errcode(db) & 0xff;
        damaged = e == SQLITE_NOTADB || e == SQLITE_CORRUPT;
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return damaged;
}
