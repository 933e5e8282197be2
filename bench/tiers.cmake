# Disk tier benchmark: restore vs sequential pread, spill vs sequential pwrite, same run.
add_executable(bench_disk bench_disk.c)
target_link_libraries(bench_disk PRIVATE cg_wserve)
# Chunk events at scale: a new gateway's convergence with 100k chunks placed (against reading
# the inventory), gateway CPU per event at 10k events/s (against redis-server's), in one run.
if(TARGET chunkgate AND TARGET chunkgate-worker AND TARGET cg_remote)
  add_executable(bench_events bench_events.c)
  target_link_libraries(bench_events PRIVATE cg_cache cg_test_redis cg_test_harness)
  cg_uses_programs(bench_events chunkgate chunkgate-worker)
endif()
