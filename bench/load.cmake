# Load test (helper "harden"): chunkgate + one chunkgate-worker under a libcurl multi driver,
# a mix of hits, misses, streams, pass-through and bad requests; RSS and fds at start and end.
if(TARGET chunkgate AND TARGET chunkgate-worker)
  add_executable(load load.c)
  target_link_libraries(load PRIVATE cg_cache cg_test_harness)
  cg_uses_programs(load chunkgate chunkgate-worker)
endif()
