# SQLite index benchmark: inserts, batched lookups vs an in-memory hash, writer updates.
add_executable(bench_index bench_index.c)
target_link_libraries(bench_index PRIVATE cg_sql cg_test_harness)
