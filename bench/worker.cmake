# Reference worker benchmarks: TTFT cold vs warm on a RAG workload, prefill and decode speed.
add_executable(bench_ttft bench_ttft.c)
target_link_libraries(bench_ttft PRIVATE cg_test_engine)
