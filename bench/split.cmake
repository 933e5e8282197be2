# Splitter and chunk-key throughput against memchr/memcpy in the same run.
add_executable(bench_split bench_split.c)
target_link_libraries(bench_split PRIVATE cg_cache)
