# Quality of reuse (DESIGN §15): KL / top-1 / TTFT per isolation mode and recompute setting
# (bench_quality, in process), and the canary's cost to live TTFT (bench_canary, the real
# chunkgate-worker over HTTP).
add_executable(bench_quality bench_quality.c)
target_link_libraries(bench_quality PRIVATE cg_test_engine)
if(TARGET chunkgate-worker)
  add_executable(bench_canary bench_canary.c)
  target_link_libraries(bench_canary PRIVATE cg_test_harness)
  cg_uses_programs(bench_canary chunkgate-worker)
endif()
