# Chunk key cost: XXH3-128 against SHA-256 (--key-hash sha256), with memcpy as the baseline.
add_executable(bench_keyhash bench_keyhash.c)
target_link_libraries(bench_keyhash PRIVATE cg_cache)
