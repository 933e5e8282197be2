# Attention kernel benchmark: cg_attn_forward GFLOP/s against raw sgemm/sgemv of the same work.
add_executable(bench_attn bench_attn.c)
target_link_libraries(bench_attn PRIVATE cg_kv cg_test_harness)
