# Kernel benchmarks: RoPE remap against memcpy, flat and from pool blocks.
add_executable(bench_remap bench_remap.c)
target_link_libraries(bench_remap PRIVATE cg_kv)
