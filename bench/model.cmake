# Reference model throughput (prefill, decode) against raw sgemm/sgemv baselines.
add_executable(bench_model bench_model.c)
target_link_libraries(bench_model PRIVATE cg_wserve cg_test_harness)
