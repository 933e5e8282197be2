# The gateway's SQLite index (sql/): schema, migrations, batching writer, crash safety.
cg_check_test(NAME test_index SOURCES test_index.c LIBS cg_sql)
