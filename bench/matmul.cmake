# Weight products at the Qwen2.5-0.5B shapes: prefill against plain f32 sgemm, decode against a
# plain 2-thread read of the same weight bytes.
add_executable(bench_matmul bench_matmul.c)
target_link_libraries(bench_matmul PRIVATE cg_wmodel cg_test_harness)
