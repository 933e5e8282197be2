# Gateway overhead on the main path vs calling the worker directly, and requests/s through
# chunkgate at 1 and 64 clients. Starts the real chunkgate and chunkgate-worker.
if(TARGET chunkgate AND TARGET chunkgate-worker)
  add_executable(bench_gateway bench_gateway.c)
  target_link_libraries(bench_gateway PRIVATE cg_cache cg_test_harness)
  cg_uses_programs(bench_gateway chunkgate chunkgate-worker)
endif()
